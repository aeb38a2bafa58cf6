/* libvconn against two real agents (node-a, node-b; started by
 * clib_test.go): dial, listen, accept, messages with immediates, the byte
 * stream, deadlines, non-blocking mode with a pollable descriptor, regions
 * and one-sided access, the quota and the error codes. With
 * VCONN_SHM=1 every vconn asks for the shared-memory path. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "check.h"

static int shm;

static vconn_client *open_client(const char *sock)
{
	struct vconn_options o = {.socket = sock, .shared_memory = shm};
	vconn_client *c = NULL;
	OK(vconn_client_open(&c, &o));
	return c;
}

static void pair(vconn_client *a, vconn_listener *l, const char *addr, vconn **da, vconn **db)
{
	OK(vconn_dial(a, addr, da));
	OK(vconn_accept(l, db));
	CHECK(vconn_is_shm(*da) == shm && vconn_is_shm(*db) == shm, "shm %d/%d, want %d", vconn_is_shm(*da), vconn_is_shm(*db), shm);
}

static void test_messages(vconn *a, vconn *b)
{
	static uint8_t buf[65536], got[65536];
	size_t sizes[] = {0, 1, 100, 4000, 60000, 0};
	sizes[5] = (size_t)vconn_max_message(a);
	for (int i = 0; i < 6; i++) {
		memset(buf, 'a' + i, sizes[i]);
		OK(vconn_send_imm(a, buf, sizes[i], 1000 + i));
		uint32_t imm = 0;
		int has = 0;
		ssize_t n = vconn_recv(b, got, sizeof got, &imm, &has);
		CHECK(n == (ssize_t)sizes[i], "message %d: %zd bytes, want %zu", i, n, sizes[i]);
		CHECK(has && imm == 1000u + i, "message %d: imm %u/%d", i, imm, has);
		CHECK(memcmp(got, buf, sizes[i]) == 0, "message %d: bytes differ", i);
		/* And back, without an immediate. */
		OK(vconn_send(b, got, (size_t)n));
		n = vconn_recv(a, buf, sizeof buf, &imm, &has);
		CHECK(n == (ssize_t)sizes[i] && !has, "echo %d: %zd bytes, imm %d", i, n, has);
	}
	CHECK(vconn_send(a, buf, (size_t)vconn_max_message(a) + 1) == -EMSGSIZE, "an oversized message");
	/* A receive buffer too small keeps the message. */
	OK(vconn_send(a, "0123456789", 10));
	CHECK(vconn_recv(b, got, 5, NULL, NULL) == -EMSGSIZE, "small buffer");
	CHECK(vconn_recv(b, got, sizeof got, NULL, NULL) == 10 && memcmp(got, "0123456789", 10) == 0, "kept message");
}

struct writer {
	vconn *v;
	size_t n;
	int err;
};

static uint8_t pattern(size_t i) { return (uint8_t)(i * 7 + (i >> 13)); }

static void *write_stream(void *arg)
{
	struct writer *w = arg;
	static uint8_t chunk[100000];
	for (size_t off = 0; off < w->n;) {
		size_t k = w->n - off < sizeof chunk ? w->n - off : sizeof chunk;
		for (size_t i = 0; i < k; i++)
			chunk[i] = pattern(off + i);
		ssize_t r = vconn_write(w->v, chunk, k);
		if (r != (ssize_t)k) {
			w->err = r < 0 ? (int)r : -EIO;
			return NULL;
		}
		off += k;
	}
	return NULL;
}

static void test_stream(vconn *a, vconn *b)
{
	CHECK(vconn_is_stream(a) && vconn_is_stream(b), "rc vconns are streams");
	struct writer w = {.v = a, .n = 4 << 20};
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	pthread_t t;
	CHECK(pthread_create(&t, NULL, write_stream, &w) == 0, "thread");
	static uint8_t buf[70000];
	size_t got = 0;
	while (got < w.n) {
		ssize_t n = vconn_read(b, buf, sizeof buf);
		CHECK(n > 0, "read at %zu: %zd", got, n);
		for (ssize_t i = 0; i < n; i++)
			CHECK(buf[i] == pattern(got + (size_t)i), "byte %zu differs", got + (size_t)i);
		got += (size_t)n;
	}
	pthread_join(t, NULL);
	CHECK(w.err == 0, "write: %s", vconn_strerror(w.err));
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("stream: %zu bytes checked in %.3f s (%.1f MB/s)\n", got, s, (double)got / s / 1e6);
	/* Round trips of small messages. */
	const int rounds = 500;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int i = 0; i < rounds; i++) {
		uint8_t m[32] = {0};
		OK(vconn_send(a, m, sizeof m));
		CHECK(vconn_recv(b, m, sizeof m, NULL, NULL) == 32, "ping %d", i);
		OK(vconn_send(b, m, sizeof m));
		CHECK(vconn_recv(a, m, sizeof m, NULL, NULL) == 32, "pong %d", i);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("round trip: %d of 32 bytes, %.1f us each\n", rounds, s / rounds * 1e6);
}

static void test_deadline_and_poll(vconn *a, vconn *b)
{
	uint8_t buf[64];
	OK(vconn_set_timeouts(b, 50, -1));
	CHECK(vconn_recv(b, buf, sizeof buf, NULL, NULL) == -ETIMEDOUT, "a read with nothing sent times out");
	OK(vconn_set_timeouts(b, -1, -1));

	OK(vconn_set_nonblock(b, 1));
	CHECK(vconn_recv(b, buf, sizeof buf, NULL, NULL) == -EAGAIN, "non-blocking, nothing sent");
	struct pollfd p = {.fd = vconn_fd(b), .events = POLLIN};
	if (!shm) /* a doorbell may hold a stale ring: only the socket's is exact */
		CHECK(poll(&p, 1, 0) == 0, "the descriptor is readable with nothing to read");
	OK(vconn_send_imm(a, "ping", 4, 7));
	ssize_t n;
	for (;;) { /* a wake-up may be spurious: read until the message */
		CHECK(poll(&p, 1, 10000) == 1, "the descriptor never became readable");
		n = vconn_recv(b, buf, sizeof buf, NULL, NULL);
		if (n != -EAGAIN)
			break;
	}
	CHECK(n == 4 && memcmp(buf, "ping", 4) == 0, "poll then recv: %zd", n);
	CHECK(vconn_recv(b, buf, sizeof buf, NULL, NULL) == -EAGAIN, "drained");
	OK(vconn_set_nonblock(b, 0));
	CHECK(vconn_wait(a, VCONN_POLLOUT, 1000) & VCONN_POLLOUT, "a is writable");
}

/* region_maps counts this process's mappings of regions' memfds, which
 * the agent names "rdmavisor-<allocation>-<vconn>-region". */
static int region_maps(void)
{
	FILE *f = fopen("/proc/self/maps", "r");
	CHECK(f != NULL, "open /proc/self/maps");
	char line[512];
	int n = 0;
	while (fgets(line, sizeof line, f))
		if (strstr(line, "memfd:rdmavisor-") && strstr(line, "-region"))
			n++;
	fclose(f);
	return n;
}

static void test_regions(vconn *a, vconn *b)
{
	uint32_t id;
	int maps = region_maps();
	OK(vconn_export(b, 8192, VCONN_ACCESS_READ | VCONN_ACCESS_WRITE, &id));
	/* The agent offers memfds: the region is memory this process maps. */
	CHECK(region_maps() == maps + 1, "the region's memfd mapped: %d mappings, want %d", region_maps(), maps + 1);
	OK(vconn_send_imm(b, NULL, 0, id)); /* tell the peer */
	uint32_t rid;
	int has;
	CHECK(vconn_recv(a, NULL, 0, &rid, &has) == 0 && has && rid == id, "region id");
	OK(vconn_write_remote(a, rid, 100, "hello", 5));
	char buf[16] = {0};
	OK(vconn_region_read(b, id, 100, buf, 5));
	CHECK(memcmp(buf, "hello", 5) == 0, "the peer's write: %s", buf);
	OK(vconn_region_write(b, id, 200, "world", 5));
	OK(vconn_read_remote(a, rid, 200, buf, 5));
	CHECK(memcmp(buf, "world", 5) == 0, "read remote: %s", buf);
	/* Larger than a frame: copied in pieces. */
	static uint8_t big[8192], back[8192];
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = pattern(i);
	OK(vconn_write_remote(a, rid, 0, big, sizeof big));
	OK(vconn_region_read(b, id, 0, back, sizeof back));
	CHECK(memcmp(big, back, sizeof big) == 0, "8 KiB through the region");
	CHECK(vconn_read_remote(a, rid, 8190, buf, 10) == -EACCES, "out of bounds");
	CHECK(vconn_read_remote(a, rid + 100, 0, buf, 1) == -EACCES, "no such region");
	CHECK(vconn_region_read(b, id, 8190, buf, 10) == -EACCES, "a local read out of bounds");
	CHECK(vconn_region_write(b, id, 8193, buf, 0) == -EACCES, "a local write past the end");
	CHECK(vconn_export(b, 16, 4, &id) == -EINVAL, "bad access");
	OK(vconn_unexport(b, id));
	CHECK(region_maps() == maps, "the region's memfd unmapped at unexport: %d mappings, want %d", region_maps(), maps);
	CHECK(vconn_region_read(b, id, 0, buf, 1) == -EACCES, "a local read after unexport");

	/* More than frames carry, both ways, byte for byte: the pod's copies
	 * into its mapping reach the peer's RDMA READ, the peer's RDMA WRITE
	 * its copies out. */
	enum { BIG = 300001 };
	static uint8_t mine[BIG], theirs[BIG], got[BIG];
	for (size_t i = 0; i < BIG; i++) {
		mine[i] = pattern(i);
		theirs[i] = (uint8_t)(pattern(i) ^ 0x5a);
	}
	OK(vconn_export(b, BIG, VCONN_ACCESS_READ | VCONN_ACCESS_WRITE, &id));
	OK(vconn_send_imm(b, NULL, 0, id));
	CHECK(vconn_recv(a, NULL, 0, &rid, &has) == 0 && has && rid == id, "region id");
	OK(vconn_region_write(b, id, 7, mine, BIG - 7));
	OK(vconn_read_remote(a, rid, 7, got, BIG - 7));
	CHECK(memcmp(got, mine, BIG - 7) == 0, "the peer reads what the pod wrote in its mapping");
	OK(vconn_write_remote(a, rid, 0, theirs, BIG));
	OK(vconn_region_read(b, id, 0, got, BIG));
	CHECK(memcmp(got, theirs, BIG) == 0, "the pod reads what the peer wrote");
	/* Closing the vconn unmaps what it still exported (b's Close, in
	 * main, counts on none being left). */
	OK(vconn_unexport(b, id));
}

static void test_quota(vconn_client *a, vconn_listener *l, const char *addr, int open)
{
	int q = vconn_client_quota(a);
	vconn *vs[64];
	int n = 0, err = 0;
	while (n < 64) {
		err = vconn_dial(a, addr, &vs[n]);
		if (err)
			break;
		vconn *acc;
		OK(vconn_accept(l, &acc));
		OK(vconn_close(acc));
		n++;
	}
	CHECK(err == -EDQUOT, "dial past the quota: %s", vconn_strerror(err));
	CHECK(n + open == q, "opened %d + %d, quota %d", n, open, q);
	printf("quota: %d vconns, the next dial: %s (%s)\n", q, vconn_strerror(err), vconn_errmsg());
	OK(vconn_close(vs[--n]));
	OK(vconn_dial(a, addr, &vs[n]));
	vconn *acc;
	OK(vconn_accept(l, &acc));
	OK(vconn_close(acc));
	n++;
	for (int i = 0; i < n; i++)
		OK(vconn_close(vs[i]));
}

int main(void)
{
	shm = getenv("VCONN_SHM") && atoi(getenv("VCONN_SHM"));
	const char *node = env("VCONN_NODE_B"), *port = env("VCONN_PORT");
	vconn_client *ca = open_client(env("VCONN_SOCK_A")), *cb = open_client(env("VCONN_SOCK_B"));
	CHECK(strcmp(vconn_client_node(cb), node) == 0, "node %s", vconn_client_node(cb));
	CHECK(vconn_client_send_window(ca) > 0 && vconn_client_max_message(ca) > 0, "hello info");
	char laddr[64], addr[128];
	snprintf(laddr, sizeof laddr, ":%s", port);
	snprintf(addr, sizeof addr, "%s:%s", node, port);
	vconn_listener *l;
	OK(vconn_listen(cb, laddr, &l));
	CHECK(strcmp(vconn_listener_addr(l), addr) == 0, "bound at %s", vconn_listener_addr(l));
	vconn_listener *l2;
	CHECK(vconn_listen(cb, laddr, &l2) == -EADDRINUSE, "a second listener on the port");

	vconn *a, *b;
	pair(ca, l, addr, &a, &b);
	test_messages(a, b);
	test_stream(a, b);
	test_deadline_and_poll(a, b);
	test_regions(a, b);

	/* The listener's descriptor. */
	vconn_listener_set_nonblock(l, 1);
	vconn *x;
	CHECK(vconn_accept(l, &x) == -EAGAIN, "nothing to accept");
	vconn_listener_set_nonblock(l, 0);
	vconn *a2, *b2;
	OK(vconn_dial(ca, addr, &a2));
	struct pollfd p = {.fd = vconn_listener_fd(l), .events = POLLIN};
	CHECK(poll(&p, 1, 10000) == 1, "the listener's descriptor");
	OK(vconn_accept(l, &b2));
	OK(vconn_close(b2));
	char buf[8];
	CHECK(vconn_recv(a2, buf, sizeof buf, NULL, NULL) == -ENODATA, "EOF after the peer's close");
	CHECK(vconn_read(a2, buf, sizeof buf) == 0, "read at EOF");
	OK(vconn_close(a2));

	test_quota(ca, l, addr, 1);

	char refused[128];
	snprintf(refused, sizeof refused, "%s:%d", node, atoi(port) + 1);
	CHECK(vconn_dial(ca, refused, &x) == -ECONNREFUSED, "nothing listens");
	printf("refused: %s: %s\n", vconn_strerror(-ECONNREFUSED), vconn_errmsg());
	CHECK(vconn_dial(ca, "node-b", &x) == -EINVAL, "no port");

	/* The peer's close: EOF after every message. */
	OK(vconn_send(a, "last", 4));
	OK(vconn_close(a));
	CHECK(vconn_recv(b, buf, sizeof buf, NULL, NULL) == 4, "the last message");
	CHECK(vconn_recv(b, buf, sizeof buf, NULL, NULL) == -ENODATA, "then EOF");
	OK(vconn_close(b));
	OK(vconn_listener_close(l));
	vconn_client_close(ca);
	vconn_client_close(cb);
	printf("ok\n");
	return 0;
}
