/*
 * uaddr: the address and length a program passes to connect or bind, and
 * the buffer and length it passes to getsockname, getpeername and accept,
 * are the program's, and may be wrong: too short, too long, or pointing to
 * no memory. The library answers for the kernel on the sockets it takes
 * over, so it keeps the kernel's rules (net/socket.c move_addr_to_kernel
 * and move_addr_to_user; tcp_v4_connect, tcp_v6_connect, inet_bind,
 * inet6_bind): it reads at most sizeof(struct sockaddr_storage) bytes,
 * only the family's size of them counts, it writes at most the length the
 * program gave, and memory it cannot reach is EFAULT, never a crash.
 */
#define _GNU_SOURCE
#include "uaddr.h"

#include <errno.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

/* The shortest sockaddr_in6 Linux takes: without sin6_scope_id (RFC 2133). */
#define SIN6_LEN_RFC2133 24

/* ucopy copies n bytes between this process's memory at local and at
 * user, reading user (write 0) or writing it (write 1), through the
 * kernel: memory the program's pointer does not reach is -EFAULT, not a
 * signal. Where the kernel refuses the call itself (a seccomp profile
 * without process_vm_readv), it copies directly, as the library did
 * before: a bad pointer then faults as the program's own access would. */
static int ucopy(void *local, void *user, size_t n, int write)
{
	if (n == 0)
		return 0;
	if (user == NULL)
		return -EFAULT;
	struct iovec l = {.iov_base = local, .iov_len = n}, r = {.iov_base = user, .iov_len = n};
	ssize_t got = write ? process_vm_writev(getpid(), &l, 1, &r, 1, 0) : process_vm_readv(getpid(), &l, 1, &r, 1, 0);
	if (got == (ssize_t)n)
		return 0;
	if (got >= 0 || errno == EFAULT)
		return -EFAULT; /* part of it, or none, is mapped */
	if (write)
		memcpy(user, local, n);
	else
		memcpy(local, user, n);
	return 0;
}

/* uaddr_in reads the address a program passed with len into dst (zeroed
 * past len): -EINVAL for a length the kernel refuses before reading (more
 * than a sockaddr_storage, or negative as the kernel's int), -EFAULT for
 * memory it cannot read. */
int uaddr_in(struct sockaddr_storage *dst, const struct sockaddr *src, socklen_t len)
{
	memset(dst, 0, sizeof *dst);
	if (len > sizeof *dst)
		return -EINVAL; /* (int)len < 0 is more than that too */
	return ucopy(dst, (void *)src, len, 0);
}

/* uaddr_len is the length TCP reports for an address of family. */
socklen_t uaddr_len(int family)
{
	return family == AF_INET6 ? sizeof(struct sockaddr_in6) : sizeof(struct sockaddr_in);
}

/* uaddr_fits says whether TCP on a socket of sock_family takes a (len
 * bytes long) as an address to connect or bind to: its own family, at
 * least the family's length. Anything else the kernel refuses (EINVAL,
 * EAFNOSUPPORT) or treats otherwise (AF_UNSPEC): the library leaves the
 * call to it. */
int uaddr_fits(int sock_family, const struct sockaddr_storage *a, socklen_t len)
{
	if (sock_family == AF_INET)
		return a->ss_family == AF_INET && len >= sizeof(struct sockaddr_in);
	if (sock_family == AF_INET6)
		return a->ss_family == AF_INET6 && len >= SIN6_LEN_RFC2133;
	return 0;
}

/* uaddr_out gives the program klen bytes of src as the kernel's
 * move_addr_to_user does: at most *ulen of them (the rest of its buffer
 * untouched), *ulen set to klen, the whole length; -EFAULT where ulen or
 * dst cannot be reached, -EINVAL for a negative *ulen. */
int uaddr_out(struct sockaddr *dst, socklen_t *ulen, const struct sockaddr_storage *src, socklen_t klen)
{
	int len;
	if (ulen == NULL || ucopy(&len, ulen, sizeof len, 0) != 0)
		return -EFAULT;
	if (len > (int)klen)
		len = (int)klen;
	if (len < 0)
		return -EINVAL;
	if (len > 0 && ucopy((void *)src, dst, (size_t)len, 1) != 0)
		return -EFAULT;
	return ucopy(&klen, ulen, sizeof klen, 1);
}
