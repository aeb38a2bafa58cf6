/* Who reads the session's socket. A thread waiting for a reply reads it
 * itself (no reader thread's wake-up between the frame and the waiter),
 * and the background reader reads what nobody waits for. Socket vconns
 * only: shared-memory ones leave the socket to the background reader. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "../src/internal.h"
#include "check.h"

#define ROUNDS 300
#define WINDOW_SENDS 8

struct echo {
	vconn_listener *l;
	int err;
};

/* echo answers every message of one accepted vconn until it ends. */
static void *echo(void *arg)
{
	struct echo *e = arg;
	vconn *v;
	if ((e->err = vconn_accept(e->l, &v)) != 0)
		return NULL;
	char buf[64];
	for (;;) {
		ssize_t n = vconn_recv(v, buf, sizeof buf, NULL, NULL);
		if (n < 0)
			break;
		if ((e->err = vconn_send(v, buf, (size_t)n)) != 0)
			break;
	}
	vconn_close(v);
	return NULL;
}

int main(void)
{
	struct nodes nd;
	open_nodes(&nd, NULL, NULL, 0);
	vconn_client *a = nd.a, *b = nd.b;
	const char *addr = nd.addr, *laddr = nd.laddr;
	vconn_listener *l;
	OK(vconn_listen(b, laddr, &l));
	struct echo e = {.l = l};
	pthread_t t;
	CHECK(pthread_create(&t, NULL, echo, &e) == 0, "thread");
	vconn *v;
	OK(vconn_dial(a, addr, &v));

	/* Round trips: the waiting thread reads its replies. A thread the
	 * scheduler leaves off a core for the reader's whole standby lets
	 * the reader read a frame or two: a few are allowed, not most. */
	unsigned long bga = vc_client_bg_frames(a), bgb = vc_client_bg_frames(b);
	char msg[32], got[64];
	for (int i = 0; i < ROUNDS; i++) {
		memset(msg, 'a' + i % 26, sizeof msg);
		OK(vconn_send(v, msg, sizeof msg));
		ssize_t n = vconn_recv(v, got, sizeof got, NULL, NULL);
		CHECK(n == (ssize_t)sizeof msg && memcmp(got, msg, sizeof msg) == 0, "echo %d: %zd bytes", i, n);
	}
	bga = vc_client_bg_frames(a) - bga;
	bgb = vc_client_bg_frames(b) - bgb;
	printf("%d round trips: %lu frames of the dialler and %lu of the echo read by their background readers\n", ROUNDS, bga, bgb);
	CHECK(bga < ROUNDS / 10 && bgb < ROUNDS / 10, "background readers read %lu and %lu of about %d frames each", bga, bgb, 2 * ROUNDS);

	/* Replies nobody waits for: sends within the window return at once,
	 * and the program then does not call the library. The background
	 * reader reads their answers (and the echoes) meanwhile. */
	unsigned long before = vc_client_bg_frames(a);
	for (int i = 0; i < WINDOW_SENDS; i++)
		OK(vconn_send(v, msg, sizeof msg));
	struct timespec nap = {0, 300 * 1000 * 1000}; /* several standbys */
	nanosleep(&nap, NULL);
	unsigned long read = vc_client_bg_frames(a) - before;
	printf("%d sends nobody waited for: the background reader read %lu frames\n", WINDOW_SENDS, read);
	CHECK(read >= WINDOW_SENDS, "the background reader read %lu frames, want the %d sends' answers at least", read, WINDOW_SENDS);
	for (int i = 0; i < WINDOW_SENDS; i++) {
		ssize_t n = vconn_recv(v, got, sizeof got, NULL, NULL);
		CHECK(n == (ssize_t)sizeof msg, "echo of send %d: %zd", i, n);
	}

	OK(vconn_close(v));
	pthread_join(t, NULL);
	CHECK(e.err == 0, "echo: %s", vconn_strerror(e.err));
	OK(vconn_listener_close(l));
	vconn_client_close(a);
	vconn_client_close(b);
	printf("ok\n");
	return 0;
}
