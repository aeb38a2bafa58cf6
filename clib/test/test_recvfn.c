/* vconn_recv_fn against two real agents (node-a, node-b; started by
 * recvfn_test.go), on shared memory (VCONN_SHM=1) or the socket: fn sees
 * each message byte for byte, empty to the largest, with immediates and
 * without; on shared memory in place, inside ring RX's slab (a copy would
 * be elsewhere), its room given back after fn (more messages than the
 * ring holds pass), with no allocation; fn's error comes back, the
 * waits are vconn_recv's, and EOF ends it. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "../src/internal.h"
#include "allocs.h"
#include "check.h"

static int shm;
static size_t max;
static uint8_t out[64 << 10];

/* fill writes message i's bytes: distinct per message and per offset. */
static void fill(uint8_t *b, size_t n, unsigned i)
{
	for (size_t k = 0; k < n; k++)
		b[k] = (uint8_t)(k * 31 + (k >> 8) + i * 101 + 1);
}

/* seen is what fn saw of a message, checked while it ran (data is valid
 * only then); want_i names the bytes it should hold (fill's i). */
struct seen {
	vconn *v;
	unsigned want_i;
	int calls, same, inside, ret;
	size_t len;
	uint32_t imm;
	int has_imm;
};

static int inside_slab(vconn *v, const void *data, size_t len)
{
	const uint8_t *s = v->shm->rx.r.slab, *p = data;
	return p >= s && len <= v->shm->rx.r.slab_len && (size_t)(p - s) <= v->shm->rx.r.slab_len - len;
}

static int fn(void *arg, const void *data, size_t len, uint32_t imm, int has_imm)
{
	struct seen *s = arg;
	static uint8_t want[64 << 10];
	s->calls++;
	s->len = len;
	s->imm = imm;
	s->has_imm = has_imm;
	fill(want, len < sizeof want ? len : sizeof want, s->want_i);
	s->same = len <= sizeof want && (len == 0 || memcmp(data, want, len) == 0);
	s->inside = !shm || inside_slab(s->v, data, len);
	return s->ret;
}

/* recv_one receives message i (n bytes, immediate 7000 + i or none). */
static void recv_one(vconn *b, size_t n, unsigned i, int with_imm)
{
	struct seen s = {.v = b, .want_i = i};
	ssize_t got = vconn_recv_fn(b, fn, &s);
	CHECK(got == (ssize_t)n && s.calls == 1 && s.len == n, "message %u: %zd (%zu bytes in %d calls), want %zu", i,
	      got, s.len, s.calls, n);
	CHECK(s.same, "message %u: fn saw other bytes", i);
	CHECK(s.inside, "message %u: not in ring RX's slab: a copy?", i);
	CHECK(s.has_imm == with_imm && (!with_imm || s.imm == 7000 + i), "message %u: imm %u/%d", i, s.imm, s.has_imm);
}

static void test_sizes(vconn *a, vconn *b)
{
	size_t sizes[] = {0, 1, 5000, 40000, max};
	for (unsigned i = 0; i < sizeof sizes / sizeof *sizes; i++) {
		size_t n = sizes[i];
		fill(out, n, i);
		OK(vconn_send_imm(a, out, n, 7000 + i));
		recv_one(b, n, i, 1);
		OK(vconn_send(a, out, n));
		recv_one(b, n, i, 0);
	}
}

struct writer {
	vconn *v;
	unsigned count;
	size_t n;
	int err;
};

static void *write_msgs(void *arg)
{
	struct writer *w = arg;
	static uint8_t m[64 << 10];
	for (unsigned i = 0; i < w->count && !w->err; i++) {
		fill(m, w->n, i);
		w->err = vconn_send_imm(w->v, m, w->n, 7000 + i);
	}
	return NULL;
}

/* test_many passes more messages than ring RX holds, in entries and in
 * slab bytes: each descriptor must be released once fn returned, else
 * fn sees the first again, or the agent's ring stays full. */
static void test_many(vconn *a, vconn *b)
{
	struct writer w = {.v = a, .count = 600, .n = 20000 < max ? 20000 : max};
	if (shm) {
		uint32_t entries = b->shm->l.entries, slab = b->shm->l.slab;
		CHECK(w.count > 2 * entries && w.count * w.n > 2 * (size_t)slab, "%u messages of %zu bytes fit the ring (%u, %u)",
		      w.count, w.n, entries, slab);
	}
	OK(vconn_set_timeouts(b, 20000, -1)); /* a ring never released: -ETIMEDOUT, not a hang */
	pthread_t t;
	CHECK(pthread_create(&t, NULL, write_msgs, &w) == 0, "thread");
	for (unsigned i = 0; i < w.count; i++)
		recv_one(b, w.n, i, 1);
	pthread_join(t, NULL);
	CHECK(w.err == 0, "write: %s", vconn_strerror(w.err));
	OK(vconn_set_timeouts(b, -1, -1));
}

/* test_errors: fn's error comes back, the message taken all the same;
 * no function; the waits of vconn_recv, without calling fn. */
static void test_errors(vconn *a, vconn *b)
{
	fill(out, 100, 1);
	OK(vconn_send_imm(a, out, 100, 7001));
	fill(out, 200, 2);
	OK(vconn_send_imm(a, out, 200, 7002));
	struct seen s = {.v = b, .want_i = 1, .ret = -12345};
	CHECK(vconn_recv_fn(b, fn, &s) == -12345 && s.calls == 1 && s.same, "fn's error");
	recv_one(b, 200, 2, 1);
	CHECK(vconn_recv_fn(b, NULL, NULL) == -EINVAL, "no function");
	s = (struct seen){.v = b};
	OK(vconn_set_nonblock(b, 1));
	CHECK(vconn_recv_fn(b, fn, &s) == -EAGAIN && s.calls == 0, "non-blocking, nothing there");
	OK(vconn_set_nonblock(b, 0));
	OK(vconn_set_timeouts(b, 50, -1));
	CHECK(vconn_recv_fn(b, fn, &s) == -ETIMEDOUT && s.calls == 0, "a deadline, nothing there");
	OK(vconn_set_timeouts(b, -1, -1));
}

/* test_allocations: rounds of messages through vconn_recv_fn, after one:
 * on shared memory no allocation at all (the socket's per-message one is
 * printed, not checked). */
static void test_allocations(vconn *a, vconn *b)
{
	long before = atomic_load(&allocs);
	vconn_client *c;
	struct vconn_options o = {.socket = env("VCONN_SOCK_A"), .shared_memory = shm};
	OK(vconn_client_open(&c, &o));
	vconn_client_close(c);
	CHECK(atomic_load(&allocs) > before, "the wrappers count nothing: is the program linked with --wrap=malloc?");
	const int rounds = 200;
	fill(out, 5000, 3);
	for (int r = -1; r < rounds; r++) {
		if (r == 0)
			before = atomic_load(&allocs);
		OK(vconn_send_imm(a, out, 5000, 7003));
		recv_one(b, 5000, 3, 1);
	}
	long n = atomic_load(&allocs) - before;
	printf("allocations: %ld sending and receiving %d messages (%s)\n", n, rounds, shm ? "shared memory" : "socket");
	if (shm)
		CHECK(n == 0, "%ld allocations receiving %d messages on shared memory", n, rounds);
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
	CHECK(max <= sizeof out, "the largest message, %zu bytes", max);

	test_sizes(a, b);
	test_many(a, b);
	test_errors(a, b);
	test_allocations(a, b);

	/* A message, then EOF: -ENODATA, fn not called, and it stays. */
	fill(out, 5000, 4);
	OK(vconn_send(a, out, 5000));
	OK(vconn_close(a));
	recv_one(b, 5000, 4, 0);
	struct seen s = {.v = b};
	CHECK(vconn_recv_fn(b, fn, &s) == -ENODATA && s.calls == 0, "EOF");
	CHECK(vconn_recv_fn(b, fn, &s) == -ENODATA && s.calls == 0, "EOF stays");
	OK(vconn_close(b));
	OK(vconn_listener_close(l));
	vconn_client_close(nd.a);
	vconn_client_close(nd.b);
	printf("ok\n");
	return 0;
}
