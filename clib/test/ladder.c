/*
 * ladder: benchmark E6's program over libvconn (ladder.h says what it
 * speaks), run by test/ladder between two agents.
 *   ladder server :PORT [shm]   listens, serves one client, exits
 *   ladder client HOST:PORT [shm]  dials, runs the commands on stdin
 * The allocation's socket is $RDMAVISOR_SOCKET; shm asks for shared-memory
 * rings. Messages are vconn messages (vconn_send, vconn_recv).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../vconn.h"
#include "ladder.h"

static int put(void *h, const void *b, size_t n)
{
	int err = vconn_send(h, b, n);
	if (err < 0)
		fprintf(stderr, "error: vconn_send: %s (%s)\n", vconn_strerror(err), vconn_errmsg());
	return err < 0 ? -1 : 0;
}

static int get(void *h, void *b, size_t n)
{
	ssize_t r = vconn_recv(h, b, n, NULL, NULL); /* larger: -EMSGSIZE */
	if (r == -ENODATA)
		return -1; /* EOF: the caller says what it means */
	if (r < 0) {
		fprintf(stderr, "error: vconn_recv: %s (%s)\n", vconn_strerror((int)r), vconn_errmsg());
		return -1;
	}
	if ((size_t)r != n) {
		fprintf(stderr, "error: a message of %zd bytes, want %zu\n", r, n);
		return -1;
	}
	return 0;
}

static void fail(const char *call, int err)
{
	fprintf(stderr, "error: %s: %s (%s)\n", call, vconn_strerror(err), vconn_errmsg());
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "shm") != 0)) {
		fprintf(stderr, "usage: ladder server :PORT [shm] | ladder client HOST:PORT [shm]\n");
		return 2;
	}
	struct vconn_options o = {.shared_memory = argc == 4};
	vconn_client *c;
	int err = vconn_client_open(&c, &o);
	if (err)
		fail("vconn_client_open", err);
	vconn *v;
	if (strcmp(argv[1], "server") == 0) {
		vconn_listener *l;
		if ((err = vconn_listen(c, argv[2], &l)))
			fail("vconn_listen", err);
		printf("ready %s\n", vconn_listener_addr(l));
		fflush(stdout);
		if ((err = vconn_accept(l, &v)))
			fail("vconn_accept", err);
	} else if (strcmp(argv[1], "client") == 0) {
		if ((err = vconn_dial(c, argv[2], &v)))
			fail("vconn_dial", err);
	} else {
		fprintf(stderr, "usage: ladder server|client ADDR [shm]\n");
		return 2;
	}
	if (vconn_is_shm(v) != (argc == 4)) {
		fprintf(stderr, "error: on shared memory: %d, want %d\n", vconn_is_shm(v), argc == 4);
		return 1;
	}
	struct ladder_io io = {.put = put, .get = get, .h = v};
	if (strcmp(argv[1], "server") == 0)
		ladder_serve(&io);
	else
		ladder_client(&io);
	vconn_close(v);
	vconn_client_close(c);
	return 0;
}
