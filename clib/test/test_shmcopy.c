/* A vconn's receive path, byte for byte, against two real agents (node-a,
 * node-b; started by shmcopy_test.go), on shared memory (VCONN_SHM=1) or
 * the socket: vconn_recv into exact and larger buffers, with immediates,
 * -EMSGSIZE keeping the message; vconn_read with buffers shorter and
 * longer than the messages, the stream reassembled exactly, the rest of
 * a message kept to EOF. On shared memory a message is copied once, from
 * the ring's slab into the caller's buffer, with no allocation: counted
 * here, no allocation per message received in steady state. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "allocs.h"
#include "check.h"

static int shm;
static size_t max;
enum { SLACK = 64, CANARY = 0xee };
static uint8_t out[(64 << 10) + SLACK], in[(64 << 10) + 2 * SLACK];

/* fill writes message i's bytes: distinct per message and per offset. */
static void fill(uint8_t *b, size_t n, unsigned i)
{
	for (size_t k = 0; k < n; k++)
		b[k] = (uint8_t)(k * 31 + (k >> 8) + i * 101 + 1);
}

/* recv_into receives message i (n bytes, immediate imm or none) into in
 * with room cap, the bytes past cap canaries that must stay. */
static void recv_into(vconn *v, size_t n, size_t cap, unsigned i, int with_imm)
{
	memset(in, CANARY, sizeof in);
	uint32_t imm = 0;
	int has = -1;
	ssize_t got = vconn_recv(v, in, cap, &imm, &has);
	CHECK(got == (ssize_t)n, "message %u: %zd bytes, want %zu (cap %zu)", i, got, n, cap);
	CHECK(has == with_imm && (!with_imm || imm == 7000 + i), "message %u: imm %u/%d", i, imm, has);
	CHECK(memcmp(in, out, n) == 0, "message %u: the bytes differ", i);
	for (size_t k = n; k < sizeof in; k++)
		CHECK(in[k] == CANARY, "message %u: byte %zu past the message written", i, k);
}

static void test_recv(vconn *a, vconn *b)
{
	size_t sizes[] = {0, 1, 100, 5000, 40000, max};
	for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		size_t n = sizes[i];
		fill(out, n, i);
		OK(vconn_send_imm(a, out, n, 7000 + i));
		recv_into(b, n, n, i, 1); /* exact */
		OK(vconn_send_imm(a, out, n, 7000 + i));
		recv_into(b, n, max + SLACK, i, 1); /* larger */
		OK(vconn_send(a, out, n));
		if (n > 0) { /* too short: kept, then whole */
			memset(in, CANARY, sizeof in);
			CHECK(vconn_recv(b, in, n - 1, NULL, NULL) == -EMSGSIZE, "message %u: %zu bytes into %zu", i, n, n - 1);
			CHECK(in[0] == CANARY, "message %u: copied though it did not fit", i);
			CHECK(vconn_recv(b, in, 0, NULL, NULL) == -EMSGSIZE, "message %u: into nothing", i);
		}
		recv_into(b, n, n, i, 0);
	}
	OK(vconn_send_imm(a, NULL, 0, 7000)); /* empty, into no buffer */
	uint32_t imm = 0;
	int has = 0;
	CHECK(vconn_recv(b, NULL, 0, &imm, &has) == 0 && has && imm == 7000, "an empty message into NULL");
}

/* The stream: messages of these sizes, their bytes one sequence. */
static const size_t stream_sizes[] = {0, 1, 100, 5000, 40000, 65536, 3, 0, 7, 4096, 4095, 4097, 1};
static uint8_t seq(size_t off) { return (uint8_t)(off * 13 + (off >> 9)); }

struct writer {
	vconn *v;
	int err;
};

static void *write_msgs(void *arg)
{
	struct writer *w = arg;
	static uint8_t m[64 << 10];
	size_t off = 0;
	for (size_t i = 0; i < sizeof stream_sizes / sizeof *stream_sizes && !w->err; i++) {
		size_t n = stream_sizes[i] < max ? stream_sizes[i] : max;
		for (size_t k = 0; k < n; k++)
			m[k] = seq(off + k);
		w->err = vconn_send(w->v, m, n);
		off += n;
	}
	return NULL;
}

static size_t stream_len(void)
{
	size_t t = 0;
	for (size_t i = 0; i < sizeof stream_sizes / sizeof *stream_sizes; i++)
		t += stream_sizes[i] < max ? stream_sizes[i] : max;
	return t;
}

/* read_stream reads the stream with reads of at most bsize bytes, each
 * checked byte for byte, and what a read wrote past them. */
static void read_stream(vconn *v, size_t bsize, size_t total)
{
	size_t got = 0;
	while (got < total) {
		memset(in, CANARY, bsize + SLACK);
		ssize_t n = vconn_read(v, in, bsize);
		CHECK(n > 0 && (size_t)n <= bsize, "read %zu at %zu: %zd", bsize, got, n);
		for (ssize_t k = 0; k < n; k++)
			CHECK(in[k] == seq(got + (size_t)k), "read %zu: byte %zu differs", bsize, got + (size_t)k);
		CHECK(in[n] == CANARY, "read %zu: wrote past what it returned", bsize);
		got += (size_t)n;
	}
}

static void test_stream(vconn *a, vconn *b)
{
	size_t bsizes[] = {1, 7, 4096, max + SLACK};
	for (unsigned i = 0; i < sizeof bsizes / sizeof *bsizes; i++) {
		struct writer w = {.v = a};
		pthread_t t;
		CHECK(pthread_create(&t, NULL, write_msgs, &w) == 0, "thread");
		read_stream(b, bsizes[i], stream_len());
		pthread_join(t, NULL);
		CHECK(w.err == 0, "write: %s", vconn_strerror(w.err));
	}
	/* A read mid-message, then a message for vconn_recv: the rest stays
	 * the stream's. */
	fill(out, 5000, 1);
	OK(vconn_send(a, out, 5000));
	CHECK(vconn_read(b, in, 10) == 10 && memcmp(in, out, 10) == 0, "the first 10 bytes");
	/* The kept rest is readable: a wait for it returns at once, with
	 * nothing more on the ring. */
	CHECK(vconn_wait(b, VCONN_POLLIN, 0) == VCONN_POLLIN, "a kept rest waits as readable");
	OK(vconn_send_imm(a, "next", 4, 7003));
	uint32_t imm;
	int has;
	CHECK(vconn_recv(b, in, sizeof in, &imm, &has) == 4 && has && imm == 7003, "recv beside a kept rest");
	CHECK(vconn_read(b, in, sizeof in) == 4990 && memcmp(in, out + 10, 4990) == 0, "the kept rest");
}

/* test_allocations receives rounds of messages, whole and split, after
 * one of each: on shared memory no allocation at all (the socket path's
 * per-message one is printed, not checked). */
static void test_allocations(vconn *a, vconn *b)
{
	long before = atomic_load(&allocs);
	vconn_client *c;
	struct vconn_options o = {.socket = env("VCONN_SOCK_A"), .shared_memory = shm};
	OK(vconn_client_open(&c, &o));
	vconn_client_close(c);
	CHECK(atomic_load(&allocs) > before, "the wrappers count nothing: is the program linked with --wrap=malloc?");
	const int rounds = 200;
	for (int r = -1; r < rounds; r++) {
		if (r == 0)
			before = atomic_load(&allocs);
		fill(out, 5000, 2);
		OK(vconn_send_imm(a, out, 100, 9));
		OK(vconn_send(a, out, 5000));
		uint32_t imm;
		int has;
		CHECK(vconn_recv(b, in, sizeof in, &imm, &has) == 100 && has && imm == 9, "round %d: recv", r);
		CHECK(vconn_read(b, in, 4096) == 4096 && vconn_read(b, in + 4096, 4096) == 904, "round %d: split", r);
		CHECK(memcmp(in, out, 5000) == 0, "round %d: the bytes differ", r);
	}
	long n = atomic_load(&allocs) - before;
	printf("allocations: %ld sending and receiving %d messages (%s)\n", n, 2 * rounds, shm ? "shared memory" : "socket");
	if (shm)
		CHECK(n == 0, "%ld allocations receiving %d messages on shared memory", n, 2 * rounds);
}

int main(void)
{
	shm = getenv("VCONN_SHM") && atoi(getenv("VCONN_SHM"));
	struct nodes nd;
	open_nodes(&nd, NULL, NULL, shm);
	vconn_listener *l;
	OK(vconn_listen(nd.b, nd.laddr, &l));
	vconn *a, *b;
	OK(vconn_dial(nd.a, nd.addr, &a));
	OK(vconn_accept(l, &b));
	CHECK(vconn_is_shm(a) == shm && vconn_is_shm(b) == shm, "shm %d/%d, want %d", vconn_is_shm(a), vconn_is_shm(b), shm);
	max = (size_t)vconn_max_message(a);
	CHECK(max <= sizeof out - SLACK, "the largest message, %zu bytes", max);

	test_recv(a, b);
	test_stream(a, b);
	test_allocations(a, b);

	/* The rest of a message read in pieces, then EOF. */
	fill(out, 5000, 3);
	OK(vconn_send(a, out, 5000));
	OK(vconn_close(a));
	size_t got = 0;
	ssize_t n;
	while ((n = vconn_read(b, in + got, 7)) > 0)
		got += (size_t)n;
	CHECK(n == 0 && got == 5000 && memcmp(in, out, 5000) == 0, "read %zu bytes to EOF (%zd)", got, n);
	CHECK(vconn_read(b, in, 7) == 0 && vconn_recv(b, in, sizeof in, NULL, NULL) == -ENODATA, "EOF stays");
	OK(vconn_close(b));
	OK(vconn_listener_close(l));
	vconn_client_close(nd.a);
	vconn_client_close(nd.b);
	printf("ok\n");
	return 0;
}
