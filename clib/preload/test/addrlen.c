/*
 * addrlen: a plain TCP program that passes odd address lengths and
 * pointers to connect, bind, getsockname, getpeername, accept and accept4,
 * for the preload library's tests (it knows nothing of vconns). Run as is,
 * the kernel answers; under the preload library, the library must answer
 * the same.
 *   addrlen client IP PORT BPORT  connect cases against IP:PORT (a
 *                                 server there), bind cases on IP:BPORT
 *   addrlen server IP PORT        listens on IP:PORT, prints "listening N"
 *                                 and accepts N connections, one a case
 * Each case runs in a child of its own (a crash is counted, not fatal) and
 * prints one line: its name, the return value and errno, and on success
 * what was reported (the length, how much of the buffer was written, the
 * family, the port where both paths name the same one). Last comes
 * "crashed N": the children killed by a signal (SIGALRM after 10 s: a
 * hang).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define BUF 4000000 /* the largest length a case passes with a buffer that big */
#define FILL 0xAA
#define FILL2 0x55 /* a second fill: a port's byte may be FILL, never both */
#define BAD ((void *)8) /* a pointer to no memory */

static struct sockaddr_in v4; /* IP:PORT, or IP:BPORT for bind */
static struct sockaddr_in6 v6; /* the same, v4-mapped */
static unsigned char *buf; /* BUF bytes: what the cases pass as addresses */
static int crashed;

static void fail(const char *what)
{
	perror(what);
	exit(1);
}

/* at returns buf filled with FILL, then with n bytes of a at its start. */
static void *at(const void *a, size_t n)
{
	memset(buf, FILL, 4096);
	memcpy(buf, a, n);
	return buf;
}

/* partial returns a pointer to n bytes whose first half is mapped and the
 * rest is not: the kernel faults part way. */
static void *partial(const void *a, size_t n)
{
	long pg = sysconf(_SC_PAGESIZE);
	unsigned char *p = mmap(NULL, (size_t)pg * 2, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || munmap(p + pg, (size_t)pg) != 0)
		fail("mmap");
	unsigned char *q = p + pg - n / 2;
	memcpy(q, a, n / 2);
	return q;
}

/* written: how many leading bytes of buf a call changed (the last byte
 * that is not fill, within the first 4096). A byte the call wrote may equal
 * the fill (an ephemeral port's low byte is 0xAA one time in 256), so a
 * case that can ask again does, over FILL2, and takes the larger count:
 * no byte equals both fills. */
static int written(int fill)
{
	int n = 4096;
	while (n > 0 && buf[n - 1] == fill)
		n--;
	return n;
}

/* over2 counts what a second asking (ask, with *len) writes over FILL2;
 * buf is left as the first asking wrote it, and first, its count over FILL,
 * is returned where it is the larger or the second asking failed. */
static int over2(int (*ask)(int, void *, socklen_t *), int s, socklen_t len, int first)
{
	static unsigned char kept[4096];
	memcpy(kept, buf, sizeof kept);
	memset(buf, FILL2, 4096);
	int n = ask(s, buf, &len) == 0 ? written(FILL2) : 0;
	memcpy(buf, kept, sizeof kept);
	return n > first ? n : first;
}

static void result(const char *name, int r)
{
	if (r < 0)
		printf("%s: ret=-1 errno=%s\n", name, strerrorname_np(errno));
	else
		printf("%s: ret=0\n", name);
}

/* named prints a call's result and, on success, what it reported (len,
 * and wrote bytes of buf): port only where both paths report the same
 * one. */
static void named(const char *name, int r, socklen_t len, int wrote, int port)
{
	if (r < 0) {
		result(name, r);
		return;
	}
	const struct sockaddr_in *s = (const void *)buf;
	printf("%s: ret=0 len=%u wrote=%d", name, (unsigned)len, wrote);
	if (len > 0 && wrote >= 2)
		printf(" family=%d", s->sin_family == AF_INET ? 4 : s->sin_family == AF_INET6 ? 6 : -1);
	if (port && wrote >= 4)
		printf(" port=%u", ntohs(s->sin_port));
	printf("\n");
}

static int peername(int s, void *a, socklen_t *len) { return getpeername(s, a, len); }
static int sockname(int s, void *a, socklen_t *len) { return getsockname(s, a, len); }

static int tcp(int family)
{
	int s = socket(family, SOCK_STREAM, 0);
	if (s < 0)
		fail("socket");
	return s;
}

/* run runs fn in a child, which prints its line; a child a signal killed
 * is a crash. */
static void run(const char *name, void (*fn)(const char *, long), long arg)
{
	fflush(stdout);
	pid_t p = fork();
	if (p < 0)
		fail("fork");
	if (p == 0) {
		alarm(10);
		fn(name, arg);
		fflush(stdout);
		_exit(0);
	}
	int st;
	if (waitpid(p, &st, 0) < 0)
		fail("waitpid");
	if (WIFSIGNALED(st)) {
		printf("%s: crashed signal %d\n", name, WTERMSIG(st));
		crashed++;
	}
}

/* Where a case's pointer points. */
enum ptr { P_BUF, P_NULL, P_BAD, P_PARTIAL };

/* A connect or bind case: a socket of family fam, the address of family
 * addr (4 or 6) passed with length len at pointer p. */
struct acase {
	const char *name;
	int fam, addr;
	socklen_t len;
	enum ptr p;
};

/* A getsockname, getpeername, accept or accept4 case: *len (at lp) and
 * the address buffer (at p); peer picks getpeername, or accept4. */
struct ncase {
	const char *name;
	int fam, peer;
	socklen_t len;
	enum ptr p, lp;
};

static void *addr_ptr(const struct acase *c)
{
	const void *a = c->addr == 6 ? (const void *)&v6 : (const void *)&v4;
	size_t n = c->addr == 6 ? sizeof v6 : sizeof v4;
	switch (c->p) {
	case P_NULL: return NULL;
	case P_BAD: return BAD;
	case P_PARTIAL: return partial(a, n);
	default: return at(a, n);
	}
}

/* report prints what getpeername (peer) or getsockname says of s, with
 * the port where both paths name the same one (port). */
static void report(const char *name, int s, int peer, int port)
{
	char n[128];
	socklen_t len = 128;
	int (*ask)(int, void *, socklen_t *) = peer ? peername : sockname;
	memset(buf, FILL, 4096);
	int r = ask(s, buf, &len);
	snprintf(n, sizeof n, "%s, then %s", name, peer ? "getpeername" : "getsockname");
	named(n, r, len, r == 0 ? over2(ask, s, 128, written(FILL)) : 0, port);
}

static void connect_case(const char *name, long i);
static void bind_case(const char *name, long i);

static const struct acase connects[] = {
	{"connect v4 len 16", AF_INET, 4, 16, P_BUF},
	{"connect v4 len 15", AF_INET, 4, 15, P_BUF},
	{"connect v4 len 1", AF_INET, 4, 1, P_BUF},
	{"connect v4 len 0", AF_INET, 4, 0, P_BUF},
	{"connect v4 len 20", AF_INET, 4, 20, P_BUF},
	{"connect v4 len 128", AF_INET, 4, 128, P_BUF},
	{"connect v4 len 129", AF_INET, 4, 129, P_BUF},
	{"connect v4 len 1024", AF_INET, 4, 1024, P_BUF},
	{"connect v4 len 4000000", AF_INET, 4, 4000000, P_BUF},
	{"connect v4 len -1", AF_INET, 4, (socklen_t)-1, P_BUF},
	{"connect v4 NULL len 16", AF_INET, 4, 16, P_NULL},
	{"connect v4 NULL len 0", AF_INET, 4, 0, P_NULL},
	{"connect v4 bad pointer len 16", AF_INET, 4, 16, P_BAD},
	{"connect v4 half-mapped len 16", AF_INET, 4, 16, P_PARTIAL},
	{"connect v4 socket, v6 address len 28", AF_INET, 6, 28, P_BUF},
	{"connect v6 len 28", AF_INET6, 6, 28, P_BUF},
	{"connect v6 len 24", AF_INET6, 6, 24, P_BUF},
	{"connect v6 len 23", AF_INET6, 6, 23, P_BUF},
	{"connect v6 len 16", AF_INET6, 6, 16, P_BUF},
	{"connect v6 len 100", AF_INET6, 6, 100, P_BUF},
	{"connect v6 len 129", AF_INET6, 6, 129, P_BUF},
	{"connect v6 socket, v4 address len 16", AF_INET6, 4, 16, P_BUF},
	{"connect v6 socket, v4 address len 28", AF_INET6, 4, 28, P_BUF},
	{"connect v6 half-mapped len 28", AF_INET6, 6, 28, P_PARTIAL},
};

static const struct acase binds[] = {
	{"bind v4 len 16", AF_INET, 4, 16, P_BUF},
	{"bind v4 len 15", AF_INET, 4, 15, P_BUF},
	{"bind v4 len 0", AF_INET, 4, 0, P_BUF},
	{"bind v4 len 20", AF_INET, 4, 20, P_BUF},
	{"bind v4 len 128", AF_INET, 4, 128, P_BUF},
	{"bind v4 len 129", AF_INET, 4, 129, P_BUF},
	{"bind v4 len 1024", AF_INET, 4, 1024, P_BUF},
	{"bind v4 len 4000000", AF_INET, 4, 4000000, P_BUF},
	{"bind v4 len -1", AF_INET, 4, (socklen_t)-1, P_BUF},
	{"bind v4 NULL len 16", AF_INET, 4, 16, P_NULL},
	{"bind v4 bad pointer len 16", AF_INET, 4, 16, P_BAD},
	{"bind v4 half-mapped len 16", AF_INET, 4, 16, P_PARTIAL},
	{"bind v4 socket, v6 address len 28", AF_INET, 6, 28, P_BUF},
	{"bind v6 len 28", AF_INET6, 6, 28, P_BUF},
	{"bind v6 len 24", AF_INET6, 6, 24, P_BUF},
	{"bind v6 len 23", AF_INET6, 6, 23, P_BUF},
	{"bind v6 len 129", AF_INET6, 6, 129, P_BUF},
	{"bind v6 socket, v4 address len 16", AF_INET6, 4, 16, P_BUF},
};

static void connect_case(const char *name, long i)
{
	const struct acase *c = &connects[i];
	int s = tcp(c->fam);
	int r = connect(s, addr_ptr(c), c->len);
	result(name, r);
	if (r == 0) {
		report(name, s, 1, 1);
		report(name, s, 0, 0);
	}
}

static void bind_case(const char *name, long i)
{
	const struct acase *c = &binds[i];
	int s = tcp(c->fam);
	int r = bind(s, addr_ptr(c), c->len);
	result(name, r);
	if (r == 0)
		report(name, s, 0, 1);
}

static const struct ncase names[] = {
	{"getsockname len 128", AF_INET, 0, 128, P_BUF, P_BUF},
	{"getsockname len 16", AF_INET, 0, 16, P_BUF, P_BUF},
	{"getsockname len 4", AF_INET, 0, 4, P_BUF, P_BUF},
	{"getsockname len 0", AF_INET, 0, 0, P_BUF, P_BUF},
	{"getsockname len 4000000", AF_INET, 0, 4000000, P_BUF, P_BUF},
	{"getsockname len -1", AF_INET, 0, (socklen_t)-1, P_BUF, P_BUF},
	{"getsockname NULL len", AF_INET, 0, 16, P_BUF, P_NULL},
	{"getsockname bad len pointer", AF_INET, 0, 16, P_BUF, P_BAD},
	{"getsockname NULL address len 16", AF_INET, 0, 16, P_NULL, P_BUF},
	{"getsockname NULL address len 0", AF_INET, 0, 0, P_NULL, P_BUF},
	{"getsockname bad address len 16", AF_INET, 0, 16, P_BAD, P_BUF},
	{"getpeername len 128", AF_INET, 1, 128, P_BUF, P_BUF},
	{"getpeername len 4", AF_INET, 1, 4, P_BUF, P_BUF},
	{"getpeername len 0", AF_INET, 1, 0, P_BUF, P_BUF},
	{"getpeername len 4000000", AF_INET, 1, 4000000, P_BUF, P_BUF},
	{"getpeername len -1", AF_INET, 1, (socklen_t)-1, P_BUF, P_BUF},
	{"getpeername NULL len", AF_INET, 1, 16, P_BUF, P_NULL},
	{"getpeername bad len pointer", AF_INET, 1, 16, P_BUF, P_BAD},
	{"getpeername NULL address len 16", AF_INET, 1, 16, P_NULL, P_BUF},
	{"getpeername bad address len 16", AF_INET, 1, 16, P_BAD, P_BUF},
	{"getpeername v6 len 128", AF_INET6, 1, 128, P_BUF, P_BUF},
	{"getpeername v6 len 24", AF_INET6, 1, 24, P_BUF, P_BUF},
	{"getsockname v6 len 128", AF_INET6, 0, 128, P_BUF, P_BUF},
};

static socklen_t *len_ptr(enum ptr lp, socklen_t *len)
{
	return lp == P_NULL ? NULL : lp == P_BAD ? BAD : len;
}

static void *name_ptr(enum ptr p)
{
	memset(buf, FILL, 4096);
	return p == P_NULL ? NULL : p == P_BAD ? BAD : buf;
}

/* name_case asks a socket connected as TCP would be (len 16 or 28) for an
 * address with the case's arguments. */
static void name_case(const char *name, long i)
{
	const struct ncase *c = &names[i];
	int s = tcp(c->fam);
	int r = c->fam == AF_INET6 ? connect(s, (void *)&v6, sizeof v6) : connect(s, (void *)&v4, sizeof v4);
	if (r != 0)
		fail("connect");
	socklen_t len = c->len;
	void *a = name_ptr(c->p);
	int (*ask)(int, void *, socklen_t *) = c->peer ? peername : sockname;
	r = ask(s, a, len_ptr(c->lp, &len));
	int wrote = written(FILL);
	if (r == 0 && a == buf && c->lp == P_BUF)
		wrote = over2(ask, s, c->len, wrote);
	named(name, r, len, wrote, c->peer);
}

static void client_cases(uint16_t bport)
{
	for (size_t i = 0; i < sizeof connects / sizeof connects[0]; i++)
		run(connects[i].name, connect_case, (long)i);
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		run(names[i].name, name_case, (long)i);
	v4.sin_port = v6.sin6_port = htons(bport);
	for (size_t i = 0; i < sizeof binds / sizeof binds[0]; i++)
		run(binds[i].name, bind_case, (long)i);
}

/* Accepted connections: each case takes one (a failed copy of the address
 * drops it, as the kernel does). */
static const struct ncase accepts[] = {
	{"accept len 16", 0, 0, 16, P_BUF, P_BUF},
	{"accept len 4", 0, 0, 4, P_BUF, P_BUF},
	{"accept len 0", 0, 0, 0, P_BUF, P_BUF},
	{"accept len 1024", 0, 0, 1024, P_BUF, P_BUF},
	{"accept len 4000000", 0, 0, 4000000, P_BUF, P_BUF},
	{"accept NULL address, NULL len", 0, 0, 0, P_NULL, P_NULL},
	{"accept NULL address, bad len pointer", 0, 0, 0, P_NULL, P_BAD},
	{"accept NULL len", 0, 0, 0, P_BUF, P_NULL},
	{"accept bad len pointer", 0, 0, 0, P_BUF, P_BAD},
	{"accept len -1", 0, 0, (socklen_t)-1, P_BUF, P_BUF},
	{"accept bad address len 16", 0, 0, 16, P_BAD, P_BUF},
	{"accept4 len 4", 0, 1, 4, P_BUF, P_BUF},
	{"accept4 len -1", 0, 1, (socklen_t)-1, P_BUF, P_BUF},
	{"accept len 16 after the failures", 0, 0, 16, P_BUF, P_BUF},
};

static int listener = -1;

static void accept_case(const char *name, long i)
{
	const struct ncase *c = &accepts[i];
	socklen_t len = c->len;
	void *a = name_ptr(c->p);
	int r = c->peer ? accept4(listener, a, len_ptr(c->lp, &len), SOCK_CLOEXEC) : accept(listener, a, len_ptr(c->lp, &len));
	int wrote = written(FILL);
	/* accept cannot be asked twice: getpeername of what it returned, with
	 * the case's length, writes the same address */
	if (r >= 0 && a == buf && c->lp == P_BUF)
		wrote = over2(peername, r, c->len, wrote);
	named(name, r < 0 ? -1 : 0, len, wrote, 0);
}

static void server_cases(void)
{
	listener = tcp(AF_INET);
	int one = 1;
	if (setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0)
		fail("setsockopt");
	if (bind(listener, (void *)&v4, sizeof v4) != 0 || listen(listener, 64) != 0)
		fail("bind, listen");
	printf("listening %zu\n", sizeof accepts / sizeof accepts[0]);
	for (size_t i = 0; i < sizeof accepts / sizeof accepts[0]; i++)
		run(accepts[i].name, accept_case, (long)i);
}

int main(int argc, char **argv)
{
	int client = argc == 5 && strcmp(argv[1], "client") == 0;
	if (!client && (argc != 4 || strcmp(argv[1], "server") != 0))
		return fprintf(stderr, "usage: addrlen client IP PORT BPORT | addrlen server IP PORT\n"), 2;
	v4.sin_family = AF_INET;
	v4.sin_port = htons((uint16_t)atoi(argv[3]));
	if (inet_pton(AF_INET, argv[2], &v4.sin_addr) != 1)
		return fprintf(stderr, "bad IP %s\n", argv[2]), 2;
	v6.sin6_family = AF_INET6;
	v6.sin6_port = v4.sin_port;
	v6.sin6_addr.s6_addr[10] = v6.sin6_addr.s6_addr[11] = 0xff;
	memcpy(&v6.sin6_addr.s6_addr[12], &v4.sin_addr, 4);
	buf = mmap(NULL, BUF, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (buf == MAP_FAILED)
		fail("mmap");
	if (client)
		client_cases((uint16_t)atoi(argv[4]));
	else
		server_cases();
	printf("crashed %d\n", crashed);
	return 0;
}
