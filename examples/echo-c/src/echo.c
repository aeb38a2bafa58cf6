/*
 * The echo example (examples/echo) in C, with libvconn: the same
 * commands, flags, output and files as the Go program.
 *
 *   echo server --port 7000 [--ready FILE]
 *   echo client --addr HOST:7000 --conns 2 --messages 1000 --size 4096 [--verdict FILE]
 *   echo show FILE
 *
 * The client prints "echo: OK ..." and exits 0 when every message came
 * back intact; --verdict writes its outcome as JSON ({ok, error, at, sent,
 * delivered}), e.g. to a pod's /dev/termination-log. The server's --ready
 * file says where it listens. Linked statically (the Makefile), it is the
 * whole of its image.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vconn.h"

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("echo: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* vconn_fail says what a libvconn call's error was, with the agent's message. */
static void vconn_fail(char *buf, size_t cap, const char *what, int err)
{
	const char *m = vconn_errmsg();
	snprintf(buf, cap, "%s: %s%s%s", what, vconn_strerror(err), m && *m ? ": " : "", m && *m ? m : "");
}

/* show prints a file this program wrote: what a probe or kubectl exec reads. */
static int show(const char *path)
{
	FILE *f = fopen(path, "r");
	char buf[4096];
	size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
	if (f)
		fclose(f);
	if (n == 0)
		die("show %s: nothing written yet (%s)", path, f ? "empty" : strerror(errno));
	fwrite(buf, 1, n, stdout);
	putchar('\n');
	return 0;
}

/* flag returns the value of --name=V or --name V at argv[*i], or NULL. */
static const char *flag(int argc, char **argv, int *i, const char *name)
{
	size_t n = strlen(name);
	const char *a = argv[*i];
	if (strncmp(a, "--", 2) == 0)
		a += 2;
	else if (a[0] == '-')
		a += 1;
	else
		return NULL;
	if (strncmp(a, name, n) != 0)
		return NULL;
	if (a[n] == '=')
		return a + n + 1;
	if (a[n] == 0 && *i + 1 < argc)
		return argv[++*i];
	return NULL;
}

/* number parses a flag's positive integer. */
static long number(const char *name, const char *v, long max)
{
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (errno || *end || n < 1 || n > max)
		die("--%s %s: want a whole number from 1 to %ld", name, v, max);
	return n;
}

/* duration parses a Go duration of number-unit pairs (90s, 2m, 1m30s, 500ms): seconds. */
static double duration(const char *v)
{
	double total = 0;
	const char *p = v;
	while (*p) {
		char *end;
		errno = 0;
		double n = strtod(p, &end);
		if (errno || end == p || n < 0)
			die("--timeout %s: want e.g. 90s, 2m, 1m30s", v);
		if (strncmp(end, "ms", 2) == 0)
			total += n / 1000, p = end + 2;
		else if (*end == 's')
			total += n, p = end + 1;
		else if (*end == 'm')
			total += n * 60, p = end + 1;
		else if (*end == 'h')
			total += n * 3600, p = end + 1;
		else
			die("--timeout %s: want e.g. 90s, 2m, 1m30s", v);
	}
	if (total <= 0)
		die("--timeout %s: want e.g. 90s, 2m, 1m30s", v);
	return total;
}

static volatile sig_atomic_t stopping;
static void on_signal(int sig) { (void)sig; stopping = 1; }

/* JSON-quotes s into out. */
static void quote(char *out, size_t cap, const char *s)
{
	size_t o = 0;
	out[o++] = '"';
	for (; *s && o + 8 < cap; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			out[o++] = '\\', out[o++] = (char)c;
		else if (c < 0x20)
			o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
		else
			out[o++] = (char)c;
	}
	out[o++] = '"';
	out[o] = 0;
}

static int write_file(const char *path, const char *s)
{
	FILE *f = fopen(path, "w");
	if (!f)
		return -errno;
	fputs(s, f);
	return fclose(f) == 0 ? 0 : -errno;
}

/* Server. */

static void *echo_vconn(void *arg)
{
	vconn *v = arg;
	char *buf = malloc(VCONN_MAX_PAYLOAD);
	long n = 0;
	ssize_t r = 0;
	while (buf && (r = vconn_recv(v, buf, VCONN_MAX_PAYLOAD, NULL, NULL)) >= 0) {
		if ((r = vconn_send(v, buf, (size_t)r)) < 0)
			break;
		n++;
	}
	fprintf(stderr, "echo: vconn from %s: echoed %ld messages (%s)\n", vconn_remote_addr(v), n,
		r == -ENODATA ? "<nil>" : vconn_strerror((int)r));
	vconn_close(v);
	free(buf);
	return NULL;
}

static int serve(vconn_client *c, long port, const char *ready)
{
	char addr[32], msg[512];
	vconn_listener *l;
	snprintf(addr, sizeof addr, ":%ld", port);
	int err = vconn_listen(c, addr, &l);
	if (err < 0) {
		vconn_fail(msg, sizeof msg, "listen", err);
		die("%s", msg);
	}
	fprintf(stderr, "echo: listening on %s\n", vconn_listener_addr(l));
	if (ready) {
		char q[300], body[320];
		quote(q, sizeof q, vconn_listener_addr(l));
		snprintf(body, sizeof body, "{\"listening\":%s}", q);
		if ((err = write_file(ready, body)) < 0)
			die("writing %s: %s", ready, strerror(-err));
	}
	/* A timeout lets the loop see a signal. */
	vconn_listener_set_timeout(l, 500);
	while (!stopping) {
		vconn *v;
		err = vconn_accept(l, &v);
		if (err == -ETIMEDOUT || err == -EAGAIN || err == -EINTR)
			continue;
		if (err < 0) {
			vconn_fail(msg, sizeof msg, "accept", err);
			die("%s", msg);
		}
		pthread_t t;
		if (pthread_create(&t, NULL, echo_vconn, v) != 0)
			die("starting a thread: %s", strerror(errno));
		pthread_detach(t);
	}
	vconn_listener_close(l);
	return 0;
}

/* Client. */

struct run {
	vconn_client *c;
	const char *addr;
	long conns, messages, size;
	struct timespec deadline;
	atomic_long sent, delivered;
	pthread_mutex_t mu;
	char error[512]; /* the first failure; guarded by mu */
};

struct worker {
	struct run *r;
	int id;
	pthread_t t;
};

static double until(const struct timespec *d)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(d->tv_sec - now.tv_sec) + (double)(d->tv_nsec - now.tv_nsec) / 1e9;
}

static void failed(struct run *r, const char *fmt, ...)
{
	va_list ap;
	pthread_mutex_lock(&r->mu);
	if (!r->error[0]) {
		va_start(ap, fmt);
		vsnprintf(r->error, sizeof r->error, fmt, ap);
		va_end(ap);
	}
	pthread_mutex_unlock(&r->mu);
}

static void fill(unsigned char *b, long size, int id, long seq)
{
	for (long i = 0; i < size; i++)
		b[i] = (unsigned char)(id * 131 + seq * 7 + i);
}

/* dial retries while nothing listens at addr yet, or its name or pod IP is not known yet. */
static int dial(struct run *r, vconn **v)
{
	for (;;) {
		int err = vconn_dial(r->c, r->addr, v);
		if (err != -ECONNREFUSED && err != -ENXIO && err != -EHOSTUNREACH)
			return err;
		if (until(&r->deadline) < 0.2 || stopping)
			return err;
		usleep(200 * 1000);
	}
}

static void *exchange(void *arg)
{
	struct worker *w = arg;
	struct run *r = w->r;
	unsigned char *msg = malloc((size_t)r->size), *back = malloc((size_t)r->size + 1);
	char why[400];
	vconn *v = NULL;
	if (!msg || !back) {
		failed(r, "vconn %d: out of memory", w->id);
		goto out;
	}
	int err = dial(r, &v);
	if (err < 0) {
		vconn_fail(why, sizeof why, "dial", err);
		failed(r, "vconn %d: %s", w->id, why);
		v = NULL;
		goto out;
	}
	int ms = (int)(until(&r->deadline) * 1000);
	vconn_set_timeouts(v, ms > 0 ? ms : 1, ms > 0 ? ms : 1);
	for (long seq = 0; seq < r->messages; seq++) {
		fill(msg, r->size, w->id, seq);
		if ((err = vconn_send(v, msg, (size_t)r->size)) < 0) {
			vconn_fail(why, sizeof why, "send", err);
			failed(r, "vconn %d: send %ld: %s", w->id, seq, why);
			goto out;
		}
		atomic_fetch_add(&r->sent, 1);
		ssize_t n = vconn_recv(v, back, (size_t)r->size + 1, NULL, NULL);
		if (n < 0) {
			vconn_fail(why, sizeof why, "receive", (int)n);
			failed(r, "vconn %d: receive %ld: %s", w->id, seq, why);
			goto out;
		}
		if (n != r->size) {
			failed(r, "vconn %d: message %ld: %zd bytes back, sent %ld", w->id, seq, n, r->size);
			goto out;
		}
		for (long i = 0; i < r->size; i++)
			if (back[i] != msg[i]) {
				failed(r, "vconn %d: message %ld: byte %ld is %#x, sent %#x", w->id, seq, i, back[i], msg[i]);
				goto out;
			}
		atomic_fetch_add(&r->delivered, 1);
	}
out:
	if (v)
		vconn_close(v);
	free(msg);
	free(back);
	return NULL;
}

static void verdict(const char *path, struct run *r)
{
	char at[64], q[600], body[1024];
	struct timespec now;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &now);
	gmtime_r(&now.tv_sec, &tm);
	size_t n = strftime(at, sizeof at, "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(at + n, sizeof at - n, ".%09ldZ", now.tv_nsec);
	quote(q, sizeof q, r->error);
	snprintf(body, sizeof body, "{\"ok\":%s,%s%s%s\"at\":\"%s\",\"sent\":%ld,\"delivered\":%ld}",
		r->error[0] ? "false" : "true", r->error[0] ? "\"error\":" : "", r->error[0] ? q : "",
		r->error[0] ? "," : "", at, atomic_load(&r->sent), atomic_load(&r->delivered));
	int err = write_file(path, body);
	if (err < 0)
		fprintf(stderr, "echo: writing the verdict to %s: %s\n", path, strerror(-err));
}

/* Command line. */

struct options {
	int server, hold;
	long port;
	const char *ready, *verdict_path;
	double timeout;
};

/* parse_flags reads the flags after the command into o, and into r for
 * a client. */
static void parse_flags(int argc, char **argv, struct options *o, struct run *r)
{
	int server = o->server;
	const char *v;
	for (int i = 2; i < argc; i++) {
		if (server && (v = flag(argc, argv, &i, "port")))
			o->port = number("port", v, 65535);
		else if (server && (v = flag(argc, argv, &i, "ready")))
			o->ready = v;
		else if (!server && (v = flag(argc, argv, &i, "addr")))
			r->addr = v;
		else if (!server && (v = flag(argc, argv, &i, "conns")))
			r->conns = number("conns", v, 100000);
		else if (!server && (v = flag(argc, argv, &i, "messages")))
			r->messages = number("messages", v, 1L << 40);
		else if (!server && (v = flag(argc, argv, &i, "size")))
			r->size = number("size", v, VCONN_MAX_PAYLOAD);
		else if (!server && (v = flag(argc, argv, &i, "timeout")))
			o->timeout = duration(v);
		else if (!server && (v = flag(argc, argv, &i, "verdict")))
			o->verdict_path = v;
		else if (!server && (strcmp(argv[i], "--hold") == 0 || strcmp(argv[i], "-hold") == 0))
			o->hold = 1;
		else
			die("%s: unknown flag or missing value %s", argv[1], argv[i]);
	}
}

/* exchange_all runs r's vconns, a thread each, to their end. */
static void exchange_all(struct run *r)
{
	struct worker *ws = calloc((size_t)r->conns, sizeof *ws);
	if (!ws)
		die("out of memory");
	for (long i = 0; i < r->conns; i++) {
		ws[i] = (struct worker){.r = r, .id = (int)i};
		if (pthread_create(&ws[i].t, NULL, exchange, &ws[i]) != 0)
			die("starting a thread: %s", strerror(errno));
	}
	for (long i = 0; i < r->conns; i++)
		pthread_join(ws[i].t, NULL);
	free(ws);
}

/* client runs the client's vconns until done or o->timeout, writes the
 * verdict and reports; it closes r->c. */
static int client(struct run *r, const struct options *o)
{
	pthread_mutex_init(&r->mu, NULL);
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	r->deadline = start;
	r->deadline.tv_sec += (time_t)o->timeout;
	r->deadline.tv_nsec += (long)((o->timeout - (double)(time_t)o->timeout) * 1e9);
	if (r->deadline.tv_nsec >= 1000000000L)
		r->deadline.tv_sec++, r->deadline.tv_nsec -= 1000000000L;
	if (!r->addr)
		snprintf(r->error, sizeof r->error, "--addr is required");
	else
		exchange_all(r);
	if (o->verdict_path)
		verdict(o->verdict_path, r);
	if (r->error[0]) {
		vconn_client_close(r->c);
		die("%s", r->error);
	}
	double d = -until(&start);
	long total = r->conns * r->messages;
	printf("echo: OK %ld vconns, %ld messages of %ld bytes checked in %.0fms (%.0f round trips/s)\n",
	       r->conns, total, r->size, d * 1000, (double)total / d);
	fflush(stdout);
	while (o->hold && !stopping)
		pause();
	vconn_client_close(r->c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		die("usage: echo server|client [flags] | echo show FILE");
	if (strcmp(argv[1], "show") == 0) {
		if (argc != 3)
			die("usage: echo show FILE");
		return show(argv[2]);
	}
	struct options o = {.server = strcmp(argv[1], "server") == 0, .port = 7000, .timeout = 120};
	if (!o.server && strcmp(argv[1], "client") != 0)
		die("unknown command \"%s\": want server or client", argv[1]);
	struct run r = {.conns = 2, .messages = 1000, .size = 4096};
	parse_flags(argc, argv, &o, &r);
	struct sigaction sa = {.sa_handler = on_signal};
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	char msg[512];
	int err = vconn_client_open(&r.c, NULL);
	if (err < 0) {
		vconn_fail(msg, sizeof msg, "connecting to the agent", err);
		die("%s", msg);
	}
	if (o.server) {
		serve(r.c, o.port, o.ready);
		vconn_client_close(r.c);
		return 0;
	}
	return client(&r, &o);
}
