/* Bridged vconns (FlagBridge): the agent hands vconns over as kernel
 * sockets. Plain read/write, poll, shutdown(SHUT_WR) as a half-close, a
 * forked child using the socket, the socket outliving its client, and a
 * bridged dialler talking to a library listener. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

static void write_all(int fd, const void *b, size_t n)
{
	for (size_t d = 0; d < n;) {
		ssize_t w = write(fd, (const char *)b + d, n - d);
		CHECK(w > 0, "write: %s", strerror(errno));
		d += (size_t)w;
	}
}

/* read_all reads until EOF: what it read. */
static size_t read_all(int fd, char *b, size_t cap)
{
	size_t n = 0;
	for (;;) {
		ssize_t r = read(fd, b + n, cap - n);
		CHECK(r >= 0, "read: %s", strerror(errno));
		if (r == 0)
			return n;
		n += (size_t)r;
		CHECK(n < cap, "more than %zu bytes", cap);
	}
}

static char big[1 << 20], got[(1 << 20) + 16];

/* request writes the request and half-closes, as the client's own
 * thread: what the two bridges and their sockets hold between a writer
 * and a reader is bounded (by the receiver's credits, as a TCP window),
 * so the reader reads meanwhile, as a peer process would. */
static void *request(void *arg)
{
	int ds = *(int *)arg;
	write_all(ds, big, sizeof big);
	CHECK(shutdown(ds, SHUT_WR) == 0, "shutdown");
	return NULL;
}

/* half_close: a request, a half-close, the answer after it, between the
 * dialled socket ds and the accepted as. */
static void half_close(int ds, int as)
{
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = (char)(i * 7 + (i >> 10));
	pthread_t w;
	CHECK(pthread_create(&w, NULL, request, &ds) == 0, "pthread_create");
	size_t n = read_all(as, got, sizeof got);
	CHECK(pthread_join(w, NULL) == 0, "pthread_join");
	CHECK(n == sizeof big && memcmp(got, big, n) == 0, "1 MiB through the bridge: %zu bytes", n);
	write_all(as, "answer", 6);
	close(as);
	n = read_all(ds, got, sizeof got);
	CHECK(n == 6 && memcmp(got, "answer", 6) == 0, "the answer after the half-close: %zu bytes", n);
	close(ds);
	printf("bridge: 1 MiB, half-close, answer: ok\n");
}

/* fork_shares: the child writes, the parent reads; both hold the socket. */
static void fork_shares(vconn_client *a, vconn_listener *l, const char *addr)
{
	int ds, as;
	OK(vconn_dial_socket(a, addr, &ds));
	OK(vconn_accept_socket(l, &as));
	pid_t pid = fork();
	CHECK(pid >= 0, "fork");
	if (pid == 0) {
		const char msg[] = "from the child";
		ssize_t w = write(ds, msg, sizeof msg - 1);
		_exit(w == (ssize_t)sizeof msg - 1 ? 0 : 1);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "the child");
	write_all(ds, " and the parent", 15);
	close(ds);
	size_t n = read_all(as, got, sizeof got);
	CHECK(n == 29 && memcmp(got, "from the child and the parent", 29) == 0, "after fork: %.*s", (int)n, got);
	close(as);
	printf("bridge: fork: ok\n");
}

/* outlives_client: the socket outlives its client; a bridged dialler
 * reaches a library listener. */
static void outlives_client(vconn_client *b, const struct vconn_options *oa, const char *node, const char *port)
{
	vconn_listener *l2;
	char addr2[128], laddr2[32];
	snprintf(addr2, sizeof addr2, "%s:%d", node, atoi(port) + 1);
	snprintf(laddr2, sizeof laddr2, ":%d", atoi(port) + 1);
	OK(vconn_listen(b, laddr2, &l2));
	vconn_client *a2;
	int ds;
	OK(vconn_client_open(&a2, oa));
	OK(vconn_dial_socket(a2, addr2, &ds));
	vconn_client_close(a2);
	vconn *v;
	OK(vconn_accept(l2, &v));
	write_all(ds, "outlived", 8);
	char buf[16];
	CHECK(vconn_read(v, buf, sizeof buf) == 8 && memcmp(buf, "outlived", 8) == 0, "a socket whose client closed");
	OK(vconn_write(v, "back", 4));
	CHECK(read(ds, buf, sizeof buf) == 4 && memcmp(buf, "back", 4) == 0, "and back");
	close(ds);
	CHECK(vconn_read(v, buf, sizeof buf) == 0, "EOF once the socket closed");
	OK(vconn_close(v));
	OK(vconn_listener_close(l2));
}

int main(void)
{
	struct nodes nd;
	open_nodes(&nd, NULL, NULL, 0);
	vconn_client *a = nd.a, *b = nd.b;
	const char *addr = nd.addr, *laddr = nd.laddr;

	vconn_listener *l;
	OK(vconn_listen_socket(b, laddr, &l));
	vconn *x;
	CHECK(vconn_accept(l, &x) == -EINVAL, "vconn_accept on a bridged listener");
	int ds, as;
	OK(vconn_dial_socket(a, addr, &ds));
	struct pollfd p = {.fd = vconn_listener_fd(l), .events = POLLIN};
	CHECK(poll(&p, 1, 10000) == 1, "the listener's descriptor");
	OK(vconn_accept_socket(l, &as));
	half_close(ds, as);
	fork_shares(a, l, addr);
	outlives_client(b, &nd.oa, nd.node, nd.port);
	OK(vconn_listener_close(l));
	vconn_client_close(a);
	vconn_client_close(b);
	printf("ok\n");
	return 0;
}
