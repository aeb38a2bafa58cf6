/*
 * ladder.h: benchmark E6's protocol (test/ladder), for its two C programs:
 * ladder.c (over libvconn) and ladder_tcp.c (plain TCP sockets, run as is
 * and under the preload library). test/ladder/ladder.py and the Go paths
 * of test/ladder speak the same.
 *
 * Over one connection, the client sends a 16-byte header (op and size as
 * u32, count as u64, little-endian), then:
 *   op 1, echo: count messages of size bytes, each written back whole by
 *             the server as it reads it;
 *   op 2, sink: count messages of size bytes; the server checks that the
 *             first 8 bytes of message i say i and answers, once it has
 *             them all, with 16 bytes: the bytes it read and the messages
 *             whose number was wrong (u64 each);
 *   op 3, quit: the server exits.
 * A "message" is one vconn message on message paths and size bytes of the
 * stream on byte-stream paths.
 *
 * The client takes commands on stdin, one a line, and answers each with a
 * line on stdout:
 *   pp SIZE INFLIGHT COUNT  ping-pong, INFLIGHT messages out at a time:
 *                           "ok ELAPSED_NS RTT_NS ..." (every round trip,
 *                           in order; each echo compared with what was sent)
 *   st SIZE COUNT           one-way stream until the server has every byte:
 *                           "ok ELAPSED_NS"
 *   quit                    sends quit and exits
 * Any failure prints "error: ..." on stderr and exits 1.
 */
#ifndef LADDER_H
#define LADDER_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LADDER_ECHO 1
#define LADDER_SINK 2
#define LADDER_QUIT 3
#define LADDER_MAX (64 * 1024)

/* ladder_io is one connection: put sends one message of n bytes; get
 * receives one message of exactly n bytes. Each returns 0, or -1 having
 * printed why. */
struct ladder_io {
	int (*put)(void *h, const void *b, size_t n);
	int (*get)(void *h, void *b, size_t n);
	void *h;
};

static void ladder_die(const char *what)
{
	fprintf(stderr, "error: %s\n", what);
	exit(1);
}

static uint64_t ladder_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void ladder_put64(unsigned char *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b[i] = (unsigned char)(v >> (8 * i));
}

static uint64_t ladder_get64(const unsigned char *b)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v |= (uint64_t)b[i] << (8 * i);
	return v;
}

static void ladder_header(unsigned char h[16], uint32_t op, uint32_t size, uint64_t count)
{
	ladder_put64(h, (uint64_t)op | (uint64_t)size << 32);
	ladder_put64(h + 8, count);
}

/* ladder_fill writes message seq of an echo: its number, then bytes that
 * depend on it and on their place. */
static void ladder_fill(unsigned char *b, size_t n, uint64_t seq)
{
	unsigned char s[8];
	ladder_put64(s, seq);
	for (size_t i = 0; i < n; i++)
		b[i] = i < 8 ? s[i] : (unsigned char)(seq * 7 + i);
}

static unsigned char ladder_buf[LADDER_MAX], ladder_exp[LADDER_MAX];

/* ladder_serve answers one client until it quits or hangs up. */
static void ladder_serve(struct ladder_io *io)
{
	unsigned char h[16];
	for (;;) {
		if (io->get(io->h, h, sizeof h) != 0)
			return; /* the client hung up */
		uint64_t w = ladder_get64(h), count = ladder_get64(h + 8);
		uint32_t op = (uint32_t)w, size = (uint32_t)(w >> 32);
		if (op == LADDER_QUIT)
			return;
		if (size < 8 || size > LADDER_MAX || (op != LADDER_ECHO && op != LADDER_SINK))
			ladder_die("bad header");
		uint64_t wrong = 0;
		for (uint64_t i = 0; i < count; i++) {
			if (io->get(io->h, ladder_buf, size) != 0)
				ladder_die("the client hung up inside a command");
			if (op == LADDER_ECHO) {
				if (io->put(io->h, ladder_buf, size) != 0)
					ladder_die("echo");
			} else if (ladder_get64(ladder_buf) != i) {
				wrong++;
			}
		}
		if (op == LADDER_SINK) {
			ladder_put64(h, count * size);
			ladder_put64(h + 8, wrong);
			if (io->put(io->h, h, sizeof h) != 0)
				ladder_die("ack");
		}
	}
}

static void ladder_pingpong(struct ladder_io *io, uint32_t size, uint64_t inflight, uint64_t count)
{
	uint64_t *sent = malloc(count * sizeof *sent), *rtt = malloc(count * sizeof *rtt);
	if (sent == NULL || rtt == NULL)
		ladder_die("out of memory");
	unsigned char h[16];
	ladder_header(h, LADDER_ECHO, size, count);
	if (io->put(io->h, h, sizeof h) != 0)
		ladder_die("header");
	uint64_t t0 = ladder_now(), next = 0;
	for (uint64_t got = 0; got < count; got++) {
		for (; next < count && next < got + inflight; next++) {
			ladder_fill(ladder_buf, size, next);
			sent[next] = ladder_now();
			if (io->put(io->h, ladder_buf, size) != 0)
				ladder_die("send");
		}
		if (io->get(io->h, ladder_exp, size) != 0)
			ladder_die("receive");
		rtt[got] = ladder_now() - sent[got];
		ladder_fill(ladder_buf, size, got);
		if (memcmp(ladder_buf, ladder_exp, size) != 0) {
			fprintf(stderr, "error: echo %llu differs from what was sent\n", (unsigned long long)got);
			exit(1);
		}
	}
	uint64_t elapsed = ladder_now() - t0;
	printf("ok %llu", (unsigned long long)elapsed);
	for (uint64_t i = 0; i < count; i++)
		printf(" %llu", (unsigned long long)rtt[i]);
	printf("\n");
	fflush(stdout);
	free(sent);
	free(rtt);
}

static void ladder_stream(struct ladder_io *io, uint32_t size, uint64_t count)
{
	unsigned char h[16];
	ladder_header(h, LADDER_SINK, size, count);
	if (io->put(io->h, h, sizeof h) != 0)
		ladder_die("header");
	ladder_fill(ladder_buf, size, 0);
	uint64_t t0 = ladder_now();
	for (uint64_t i = 0; i < count; i++) {
		ladder_put64(ladder_buf, i);
		if (io->put(io->h, ladder_buf, size) != 0)
			ladder_die("send");
	}
	if (io->get(io->h, h, sizeof h) != 0)
		ladder_die("receive the server's count");
	uint64_t elapsed = ladder_now() - t0;
	if (ladder_get64(h) != count * size || ladder_get64(h + 8) != 0) {
		fprintf(stderr, "error: the server read %llu bytes (%llu messages misnumbered), want %llu\n",
			(unsigned long long)ladder_get64(h), (unsigned long long)ladder_get64(h + 8),
			(unsigned long long)(count * size));
		exit(1);
	}
	printf("ok %llu\n", (unsigned long long)elapsed);
	fflush(stdout);
}

/* ladder_client runs the commands on stdin. */
static void ladder_client(struct ladder_io *io)
{
	char line[256];
	while (fgets(line, sizeof line, stdin) != NULL) {
		unsigned size;
		unsigned long long inflight, count;
		if (sscanf(line, "pp %u %llu %llu", &size, &inflight, &count) == 3 && size >= 8 &&
		    size <= LADDER_MAX && inflight >= 1 && count >= 1) {
			ladder_pingpong(io, size, inflight, count);
		} else if (sscanf(line, "st %u %llu", &size, &count) == 2 && size >= 8 && size <= LADDER_MAX &&
			   count >= 1) {
			ladder_stream(io, size, count);
		} else if (strncmp(line, "quit", 4) == 0) {
			unsigned char h[16];
			ladder_header(h, LADDER_QUIT, 0, 0);
			if (io->put(io->h, h, sizeof h) != 0)
				ladder_die("quit");
			return;
		} else {
			fprintf(stderr, "error: bad command %s", line);
			exit(1);
		}
	}
}

#endif
