/* The kernel's rules for the addresses and lengths a program passes to and
 * gets from the socket calls (uaddr.c). */
#ifndef RDMAVISOR_PRELOAD_UADDR_H
#define RDMAVISOR_PRELOAD_UADDR_H

#include <sys/socket.h>

int uaddr_in(struct sockaddr_storage *dst, const struct sockaddr *src, socklen_t len);
socklen_t uaddr_len(int family);
int uaddr_fits(int sock_family, const struct sockaddr_storage *a, socklen_t len);
int uaddr_out(struct sockaddr *dst, socklen_t *ulen, const struct sockaddr_storage *src, socklen_t klen);

#endif
