/* Many threads on one client: several vconns at once, each with a writer
 * and a reader thread, plus threads that only dial and close; then the
 * agent of one side goes away (VCONN_STOP: the Go test stops it when this
 * prints "stop") and every blocked call returns -ENOTCONN. Run under
 * ASan/UBSan, and under TSan with -clib.sanitize=thread. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "check.h"

#define PAIRS 4
#define BYTES (1 << 20)

static uint8_t pat(int pair, size_t i) { return (uint8_t)(pair * 31 + i * 13 + (i >> 11)); }

struct side {
	vconn *v;
	int pair, err;
	size_t n;
};

static void *writer(void *arg)
{
	struct side *s = arg;
	static _Thread_local uint8_t buf[30000];
	for (size_t off = 0; off < BYTES;) {
		size_t k = BYTES - off < sizeof buf ? BYTES - off : sizeof buf;
		for (size_t i = 0; i < k; i++)
			buf[i] = pat(s->pair, off + i);
		ssize_t w = vconn_write(s->v, buf, k);
		if (w != (ssize_t)k) {
			s->err = w < 0 ? (int)w : -EIO;
			return NULL;
		}
		off += k;
	}
	return NULL;
}

static void *reader(void *arg)
{
	struct side *s = arg;
	static _Thread_local uint8_t buf[50000];
	while (s->n < BYTES) {
		ssize_t r = vconn_read(s->v, buf, sizeof buf);
		if (r <= 0) {
			s->err = r < 0 ? (int)r : -ENODATA;
			return NULL;
		}
		for (ssize_t i = 0; i < r; i++)
			if (buf[i] != pat(s->pair, s->n + (size_t)i)) {
				s->err = -EILSEQ;
				return NULL;
			}
		s->n += (size_t)r;
	}
	return NULL;
}

struct churn {
	vconn_client *c;
	const char *addr;
	int err;
};

static void *dialer(void *arg)
{
	struct churn *ch = arg;
	for (int i = 0; i < 10; i++) {
		vconn *v;
		int err = vconn_dial(ch->c, ch->addr, &v);
		if (err == -EDQUOT)
			continue; /* the quota is shared with the other dialler */
		if (err) {
			ch->err = err;
			return NULL;
		}
		if ((err = vconn_send(v, "x", 1)) != 0 || (err = vconn_close(v)) != 0) {
			ch->err = err;
			return NULL;
		}
	}
	return NULL;
}

struct acceptor {
	vconn_listener *l;
	int n;
};

static void *acceptor(void *arg)
{
	struct acceptor *a = arg;
	for (;;) {
		vconn *v;
		if (vconn_accept(a->l, &v) != 0)
			return NULL;
		char b[4];
		vconn_recv(v, b, sizeof b, NULL, NULL);
		vconn_close(v);
		a->n++;
	}
}

/* pairs runs PAIRS vconns at once, each with a writer and a reader
 * thread; the readers' vconns (r) stay open. */
static void pairs(vconn_client *a, vconn_listener *l, const char *addr, struct side r[PAIRS])
{
	struct side w[PAIRS];
	pthread_t tw[PAIRS], tr[PAIRS];
	for (int i = 0; i < PAIRS; i++) {
		memset(&w[i], 0, sizeof w[i]);
		memset(&r[i], 0, sizeof r[i]);
		OK(vconn_dial(a, addr, &w[i].v));
		OK(vconn_accept(l, &r[i].v));
		w[i].pair = r[i].pair = i;
	}
	for (int i = 0; i < PAIRS; i++) {
		CHECK(pthread_create(&tw[i], NULL, writer, &w[i]) == 0, "thread");
		CHECK(pthread_create(&tr[i], NULL, reader, &r[i]) == 0, "thread");
	}
	for (int i = 0; i < PAIRS; i++) {
		pthread_join(tw[i], NULL);
		pthread_join(tr[i], NULL);
		CHECK(w[i].err == 0 && r[i].err == 0, "pair %d: write %s, read %s after %zu bytes", i,
		      vconn_strerror(w[i].err), vconn_strerror(r[i].err), r[i].n);
	}
	printf("%d vconns, %d bytes each way, checked\n", PAIRS, BYTES);
	for (int i = 0; i < PAIRS; i++)
		OK(vconn_close(w[i].v));
}

/* churn_dials: dials and closes racing accepts and closes on the other
 * side, on a listener of their own, shut down under its acceptor when
 * done. */
static void churn_dials(vconn_client *a, vconn_client *b, const char *node, const char *port)
{
	char caddr[128], claddr[32];
	snprintf(caddr, sizeof caddr, "%s:%d", node, atoi(port) + 1);
	snprintf(claddr, sizeof claddr, ":%d", atoi(port) + 1);
	vconn_listener *cl;
	OK(vconn_listen(b, claddr, &cl));
	struct acceptor ac = {.l = cl};
	pthread_t ta, td[2];
	CHECK(pthread_create(&ta, NULL, acceptor, &ac) == 0, "thread");
	struct churn ch[2] = {{a, caddr, 0}, {a, caddr, 0}};
	for (int i = 0; i < 2; i++)
		CHECK(pthread_create(&td[i], NULL, dialer, &ch[i]) == 0, "thread");
	for (int i = 0; i < 2; i++) {
		pthread_join(td[i], NULL);
		CHECK(ch[i].err == 0, "dialler %d: %s", i, vconn_strerror(ch[i].err));
	}
	OK(vconn_listener_shutdown(cl)); /* ends the acceptor, wherever it is */
	pthread_join(ta, NULL);
	OK(vconn_listener_close(cl));
	printf("churn: %d vconns accepted\n", ac.n);
}

/* close_wakes_read: a close wakes a read blocked on the vconn in another
 * thread. */
static void close_wakes_read(vconn_client *a, vconn_listener *l, const char *addr)
{
	vconn *v2, *b2;
	OK(vconn_dial(a, addr, &v2));
	OK(vconn_accept(l, &b2));
	struct side rs = {.v = v2};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, reader, &rs) == 0, "thread");
	struct timespec nap = {0, 50 * 1000 * 1000}; /* lets it block; either order passes */
	nanosleep(&nap, NULL);
	OK(vconn_close(v2));
	pthread_join(t, NULL);
	CHECK(rs.err == -EBADF, "a read the vconn's close interrupted: %s", vconn_strerror(rs.err));
	OK(vconn_close(b2));
}

/* agent_gone: the agent goes (the Go test stops it at "stop"): a blocked
 * read returns, and so does the rest. */
static void agent_gone(vconn_client *a, const char *addr)
{
	vconn *v;
	OK(vconn_dial(a, addr, &v));
	printf("stop\n");
	fflush(stdout);
	char buf[8];
	ssize_t n = vconn_recv(v, buf, sizeof buf, NULL, NULL);
	/* The agent may fail the vconn (reset, shutting down) before it
	 * closes the socket: either ends the read. */
	CHECK(n < 0 && n != -EAGAIN && n != -ETIMEDOUT, "a read while the agent stops: %zd", n);
	printf("agent gone: the read: %s (%s)\n", vconn_strerror((int)n), vconn_errmsg());
	CHECK(vconn_send(v, "x", 1) < 0, "a send after");
	vconn *x;
	/* The agent may still answer while it stops (shutting down, quota):
	 * any failure will do, then the session's end. */
	int derr = vconn_dial(a, addr, &x);
	CHECK(derr < 0, "a dial after: %s", vconn_strerror(derr));
	printf("agent gone: a dial: %s\n", vconn_strerror(derr));
	vconn_close(v);
}

int main(void)
{
	int shm = getenv("VCONN_SHM") && atoi(getenv("VCONN_SHM"));
	struct nodes nd;
	open_nodes(&nd, NULL, NULL, shm);
	vconn_client *a = nd.a, *b = nd.b;
	const char *node = nd.node, *port = nd.port, *addr = nd.addr, *laddr = nd.laddr;
	vconn_listener *l;
	OK(vconn_listen(b, laddr, &l));

	struct side r[PAIRS];
	pairs(a, l, addr, r);
	churn_dials(a, b, node, port);
	close_wakes_read(a, l, addr);
	agent_gone(a, addr);
	vconn_listener_close(l);
	for (int i = 0; i < PAIRS; i++)
		vconn_close(r[i].v);
	vconn_client_close(a);
	vconn_client_close(b);
	printf("ok\n");
	return 0;
}
