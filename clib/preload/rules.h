/* What the library takes over: the variables' rules (rules.c). */
#ifndef RDMAVISOR_PRELOAD_RULES_H
#define RDMAVISOR_PRELOAD_RULES_H

#include <netinet/in.h>
#include <stdint.h>
#include <sys/socket.h>

void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
void rules_load(void);
int rules_connect(void);
int rules_listen(void);
void addr_of(const struct sockaddr *a, struct in6_addr *ip, uint16_t *port, int *family);
int wants_connect(const struct sockaddr *a);
int wants_listen(uint16_t port);

#endif
