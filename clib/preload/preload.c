/*
 * librdmavisor-preload: vconns for programs that know only TCP.
 *
 * LD_PRELOAD=librdmavisor-preload.so with
 *   RDMAVISOR_SOCKET         the allocation's socket (set in pods by the device plugin)
 *   RDMAVISOR_PRELOAD_CONNECT destinations: comma-separated "ip:port", "ip:*" or "*:port"
 *   RDMAVISOR_PRELOAD_LISTEN  listen ports: comma-separated port numbers, or "*"
 * makes connect() to a named destination dial a vconn, and bind()+listen()
 * on a named port listen on vconns. The program gets a real kernel socket
 * (a stream socket the agent bridges to the vconn: docs/protocol.md,
 * Bridge), so poll, epoll, select, fork, dup, sendfile and non-blocking
 * I/O behave as on TCP. Everything not named stays plain TCP.
 *
 * A malformed variable stops the program at start with a message naming
 * it: a silent fallback to TCP would hide that vconns are not in use.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../vconn.h"
#include "rules.h"
#include "uaddr.h"

/* The calls this library replaces are its only exported symbols (the
 * objects are built with hidden visibility: libvconn's stay internal). */
#define PUBLIC __attribute__((visibility("default")))

/* What the library knows of a descriptor. */
enum kind { K_NONE = 0, K_BOUND, K_LISTENER, K_CONN };
struct fdinfo {
	enum kind kind;
	struct sockaddr_storage local, peer; /* as TCP would report them */
	socklen_t local_len, peer_len;
	int family; /* of the program's TCP socket, which the bridged one replaced */
};

/* Descriptors are small integers: a table, grown under a lock. */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct fdinfo *fds;
static int nfds;

static int (*real_connect)(int, const struct sockaddr *, socklen_t);
static int (*real_bind)(int, const struct sockaddr *, socklen_t);
static int (*real_listen)(int, int);
static int (*real_accept)(int, struct sockaddr *, socklen_t *);
static int (*real_accept4)(int, struct sockaddr *, socklen_t *, int);
static int (*real_close)(int);
static int (*real_getsockname)(int, struct sockaddr *, socklen_t *);
static int (*real_getpeername)(int, struct sockaddr *, socklen_t *);
static int (*real_setsockopt)(int, int, int, const void *, socklen_t);
static int (*real_getsockopt)(int, int, int, void *, socklen_t *);
static int (*real_dup)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);

#define RESOLVE(f)                                                   \
	do {                                                         \
		*(void **)(&real_##f) = dlsym(RTLD_NEXT, #f);        \
		if (real_##f == NULL)                                \
			die("cannot find libc's %s: %s", #f, dlerror()); \
	} while (0)

__attribute__((constructor)) static void init(void)
{
	RESOLVE(connect);
	RESOLVE(bind);
	RESOLVE(listen);
	RESOLVE(accept);
	RESOLVE(accept4);
	RESOLVE(close);
	RESOLVE(getsockname);
	RESOLVE(getpeername);
	RESOLVE(setsockopt);
	RESOLVE(getsockopt);
	RESOLVE(dup);
	RESOLVE(dup2);
	RESOLVE(dup3);
	rules_load();
}

/* The table. */

static struct fdinfo *slot(int fd, int grow)
{
	if (fd < 0)
		return NULL;
	if (fd >= nfds) {
		if (!grow)
			return NULL;
		int n = nfds ? nfds : 64;
		while (n <= fd)
			n *= 2;
		struct fdinfo *t = realloc(fds, (size_t)n * sizeof *t);
		if (t == NULL)
			return NULL;
		memset(t + nfds, 0, (size_t)(n - nfds) * sizeof *t);
		fds = t;
		nfds = n;
	}
	return &fds[fd];
}

static enum kind kind_of(int fd)
{
	pthread_mutex_lock(&mu);
	struct fdinfo *i = slot(fd, 0);
	enum kind k = i ? i->kind : K_NONE;
	pthread_mutex_unlock(&mu);
	return k;
}

static void forget(int fd)
{
	pthread_mutex_lock(&mu);
	struct fdinfo *i = slot(fd, 0);
	if (i)
		memset(i, 0, sizeof *i);
	pthread_mutex_unlock(&mu);
}

static void copy_info(int from, int to)
{
	pthread_mutex_lock(&mu);
	struct fdinfo *a = slot(from, 0), *b = slot(to, 1);
	if (b) {
		a = slot(from, 0); /* the table may have moved */
		if (a)
			*b = *a;
		else
			memset(b, 0, sizeof *b);
	}
	pthread_mutex_unlock(&mu);
}

static int family_of(int fd);

/* is_tcp: fd is a stream socket of the Internet families and a (len
 * bytes, read with uaddr_in) an address TCP takes on it. Otherwise the
 * call is the kernel's, with its errors for the same arguments. */
static int is_tcp(int fd, const struct sockaddr_storage *a, socklen_t len)
{
	if (!uaddr_fits(family_of(fd), a, len))
		return 0;
	int t = 0;
	socklen_t n = sizeof t;
	return real_getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &n) == 0 && t == SOCK_STREAM;
}

/* vconn address of a sockaddr: "ip:port", "[ip6]:port". */
static void vaddr(const struct sockaddr *a, char *out, size_t n)
{
	struct in6_addr ip;
	uint16_t port;
	int fam;
	addr_of(a, &ip, &port, &fam);
	char h[INET6_ADDRSTRLEN];
	if (fam == AF_INET) {
		inet_ntop(AF_INET, &ip.s6_addr[12], h, sizeof h);
		snprintf(out, n, "%s:%u", h, port);
	} else {
		inet_ntop(AF_INET6, &ip, h, sizeof h);
		snprintf(out, n, "[%s]:%u", h, port);
	}
}

/* sockaddr of a vconn address "ip:port" in the family of the socket. */
static socklen_t sockaddr_of(const char *s, int family, struct sockaddr_storage *out)
{
	memset(out, 0, sizeof *out);
	const char *colon = strrchr(s, ':');
	char h[INET6_ADDRSTRLEN];
	size_t hl = colon ? (size_t)(colon - s) : 0;
	if (hl >= 2 && s[0] == '[')
		s++, hl -= 2;
	if (colon == NULL || hl >= sizeof h)
		hl = 0;
	memcpy(h, s, hl);
	h[hl] = 0;
	unsigned port = colon ? (unsigned)atoi(colon + 1) : 0;
	struct in_addr a4;
	struct in6_addr a6;
	int v4 = inet_pton(AF_INET, h, &a4) == 1;
	if (family == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)out;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		if (v4)
			a->sin_addr = a4;
		return sizeof *a;
	}
	struct sockaddr_in6 *a = (struct sockaddr_in6 *)out;
	a->sin6_family = AF_INET6;
	a->sin6_port = htons((uint16_t)port);
	if (v4) {
		a->sin6_addr.s6_addr[10] = a->sin6_addr.s6_addr[11] = 0xff;
		memcpy(&a->sin6_addr.s6_addr[12], &a4, 4);
	} else if (inet_pton(AF_INET6, h, &a6) == 1) {
		a->sin6_addr = a6;
	}
	return sizeof *a;
}

static int family_of(int fd)
{
	int d = 0;
	socklen_t n = sizeof d;
	if (real_getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &d, &n) != 0)
		return AF_INET;
	return d;
}

/* replace puts newfd in fd's place, keeping fd's status flags (O_NONBLOCK)
 * and close-on-exec, as the program set them on its TCP socket. */
static int replace(int fd, int newfd)
{
	int fl = fcntl(fd, F_GETFL), cloexec = fcntl(fd, F_GETFD);
	if (fl < 0 || cloexec < 0 || fcntl(newfd, F_SETFL, fl & O_NONBLOCK) < 0) {
		int e = errno;
		real_close(newfd);
		return -e;
	}
	int r = real_dup3(newfd, fd, (cloexec & FD_CLOEXEC) ? O_CLOEXEC : 0);
	int e = errno;
	real_close(newfd);
	return r < 0 ? -e : 0;
}

static struct vconn_options opts(void)
{
	struct vconn_options o;
	memset(&o, 0, sizeof o);
	return o; /* the socket from RDMAVISOR_SOCKET */
}

/* The calls. */

PUBLIC int connect(int fd, const struct sockaddr *ua, socklen_t len)
{
	/* The program's address, read as the kernel reads it: a length or
	 * pointer it refuses leaves the call to it. */
	struct sockaddr_storage ss;
	const struct sockaddr *a = (const struct sockaddr *)&ss;
	if (!rules_connect() || uaddr_in(&ss, ua, len) != 0 || !is_tcp(fd, &ss, len) || !wants_connect(a))
		return real_connect(fd, ua, len);
	char addr[INET6_ADDRSTRLEN + 16];
	vaddr(a, addr, sizeof addr);
	struct vconn_options o = opts();
	int s = vconn_bridge_dial(&o, addr, SOCK_CLOEXEC);
	if (s < 0) {
		errno = -s;
		return -1;
	}
	int fam = family_of(fd);
	int r = replace(fd, s);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	pthread_mutex_lock(&mu);
	struct fdinfo *i = slot(fd, 1);
	if (i) {
		i->kind = K_CONN;
		i->family = fam;
		i->peer = ss;
		i->peer_len = uaddr_len(fam); /* TCP's length, not the program's */
		i->local_len = sockaddr_of("0.0.0.0:0", fam, &i->local);
	}
	pthread_mutex_unlock(&mu);
	return 0;
}

PUBLIC int bind(int fd, const struct sockaddr *ua, socklen_t len)
{
	struct sockaddr_storage ss;
	if (!rules_listen() || uaddr_in(&ss, ua, len) != 0 || !is_tcp(fd, &ss, len))
		return real_bind(fd, ua, len);
	struct in6_addr ip;
	uint16_t port;
	int fam;
	addr_of((const struct sockaddr *)&ss, &ip, &port, &fam);
	if (!wants_listen(port))
		return real_bind(fd, ua, len);
	/* No TCP port is taken: the port is the pod's vconn port, bound at
	 * listen, where its errors (in use) are reported. */
	pthread_mutex_lock(&mu);
	struct fdinfo *i = slot(fd, 1);
	if (i) {
		i->kind = K_BOUND;
		i->family = ss.ss_family;
		i->local = ss;
		i->local_len = uaddr_len(ss.ss_family);
	}
	pthread_mutex_unlock(&mu);
	if (i == NULL) {
		errno = ENOMEM;
		return -1;
	}
	return 0;
}

PUBLIC int listen(int fd, int backlog)
{
	if (kind_of(fd) != K_BOUND)
		return real_listen(fd, backlog);
	struct sockaddr_storage local;
	pthread_mutex_lock(&mu);
	local = fds[fd].local;
	pthread_mutex_unlock(&mu);
	struct in6_addr ip;
	uint16_t port;
	int fam;
	addr_of((struct sockaddr *)&local, &ip, &port, &fam);
	char addr[16];
	snprintf(addr, sizeof addr, ":%u", port);
	struct vconn_options o = opts();
	int s = vconn_bridge_listen(&o, addr, NULL, 0);
	/* A listener this process just closed goes when the agent has read
	 * the close: a server that listens again at once (iperf3 does, after
	 * each test) waits for it, as SO_REUSEADDR lets TCP rebind at once. */
	for (int i = 0; s == -EADDRINUSE && i < 40; i++) {
		struct timespec ts = {.tv_nsec = 50 * 1000 * 1000};
		nanosleep(&ts, NULL);
		s = vconn_bridge_listen(&o, addr, NULL, 0);
	}
	if (s < 0) {
		errno = -s;
		return -1;
	}
	int r = replace(fd, s);
	if (r < 0) {
		errno = -r;
		return -1;
	}
	pthread_mutex_lock(&mu);
	fds[fd].kind = K_LISTENER;
	pthread_mutex_unlock(&mu);
	return 0;
}

static int do_accept(int fd, struct sockaddr *a, socklen_t *len, int flags)
{
	char remote[INET6_ADDRSTRLEN + 16];
	int s = vconn_bridge_accept(fd, flags & (SOCK_NONBLOCK | SOCK_CLOEXEC), remote, sizeof remote);
	if (s < 0) {
		errno = -s;
		return -1;
	}
	struct sockaddr_storage peer;
	socklen_t peer_len;
	pthread_mutex_lock(&mu);
	struct fdinfo *i = slot(s, 1), *l = slot(fd, 0); /* l after the table grew */
	int fam = l && l->family ? l->family : AF_INET; /* the bridged listener's is AF_UNIX */
	peer_len = sockaddr_of(remote, fam, &peer);
	if (i) {
		i->kind = K_CONN;
		i->family = fam;
		if (l)
			i->local = l->local, i->local_len = l->local_len;
		i->peer = peer, i->peer_len = peer_len;
	}
	pthread_mutex_unlock(&mu);
	/* As the kernel's accept: the address is copied after the connection
	 * is taken, and a copy that fails drops the connection. */
	int r = a ? uaddr_out(a, len, &peer, peer_len) : 0;
	if (r < 0) {
		forget(s);
		real_close(s);
		errno = -r;
		return -1;
	}
	return s;
}

PUBLIC int accept(int fd, struct sockaddr *a, socklen_t *len)
{
	if (kind_of(fd) != K_LISTENER)
		return real_accept(fd, a, len);
	return do_accept(fd, a, len, 0);
}

PUBLIC int accept4(int fd, struct sockaddr *a, socklen_t *len, int flags)
{
	if (kind_of(fd) != K_LISTENER)
		return real_accept4(fd, a, len, flags);
	return do_accept(fd, a, len, flags);
}

PUBLIC int close(int fd)
{
	if (kind_of(fd) != K_NONE)
		forget(fd);
	return real_close(fd);
}

/* name_of gives the address TCP would report of fd: 0, -errno, or 1 when
 * fd is not the library's. */
static int name_of(int fd, struct sockaddr *a, socklen_t *len, int peer)
{
	pthread_mutex_lock(&mu);
	struct fdinfo *i = slot(fd, 0);
	if (i == NULL || i->kind == K_NONE || (peer && i->kind != K_CONN)) {
		pthread_mutex_unlock(&mu);
		return 1; /* not ours */
	}
	struct sockaddr_storage s = peer ? i->peer : i->local;
	socklen_t n = peer ? i->peer_len : i->local_len;
	pthread_mutex_unlock(&mu);
	return uaddr_out(a, len, &s, n); /* outside the lock: it may fault */
}

/* named answers for name_of: 1 is the kernel's to answer. */
static int named(int r)
{
	if (r < 0) {
		errno = -r;
		return -1;
	}
	return 0;
}

PUBLIC int getsockname(int fd, struct sockaddr *a, socklen_t *len)
{
	int r = name_of(fd, a, len, 0);
	return r == 1 ? real_getsockname(fd, a, len) : named(r);
}

PUBLIC int getpeername(int fd, struct sockaddr *a, socklen_t *len)
{
	int r = name_of(fd, a, len, 1);
	return r == 1 ? real_getpeername(fd, a, len) : named(r);
}

/* TCP options have no meaning on the bridged socket: setting one succeeds
 * (the vconn has no Nagle, no keepalive to tune), reading one reads zero. */
PUBLIC int setsockopt(int fd, int level, int opt, const void *v, socklen_t n)
{
	if (kind_of(fd) == K_NONE)
		return real_setsockopt(fd, level, opt, v, n);
	if (level == IPPROTO_TCP || level == IPPROTO_IP || level == IPPROTO_IPV6)
		return 0;
	int r = real_setsockopt(fd, level, opt, v, n);
	if (r < 0 && (errno == ENOPROTOOPT || errno == EOPNOTSUPP))
		return 0;
	return r;
}

PUBLIC int getsockopt(int fd, int level, int opt, void *v, socklen_t *n)
{
	if (kind_of(fd) == K_NONE || (level != IPPROTO_TCP && level != IPPROTO_IP && level != IPPROTO_IPV6))
		return real_getsockopt(fd, level, opt, v, n);
	if (v && n) {
		memset(v, 0, *n);
		if (level == IPPROTO_TCP && opt == TCP_MAXSEG && *n >= sizeof(int))
			*(int *)v = 65483; /* the largest TCP segment on loopback, as a sender would see */
	}
	return 0;
}

PUBLIC int dup(int fd)
{
	int r = real_dup(fd);
	if (r >= 0 && kind_of(fd) != K_NONE)
		copy_info(fd, r);
	return r;
}

PUBLIC int dup2(int fd, int to)
{
	int r = real_dup2(fd, to);
	if (r >= 0 && fd != to)
		copy_info(fd, r);
	return r;
}

PUBLIC int dup3(int fd, int to, int flags)
{
	int r = real_dup3(fd, to, flags);
	if (r >= 0)
		copy_info(fd, r);
	return r;
}
