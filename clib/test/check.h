/* A minimal test harness for libvconn's C tests: each CHECK that fails
 * prints where and why, with the library's message, and exits 1. */
#ifndef VCONN_TEST_CHECK_H
#define VCONN_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "../vconn.h"

#define CHECK(cond, ...)                                                              \
	do {                                                                          \
		if (!(cond)) {                                                        \
			fprintf(stderr, "%s:%d: CHECK(%s) failed: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                                 \
			fprintf(stderr, " (last error: %s)\n", vconn_errmsg());       \
			exit(1);                                                      \
		}                                                                     \
	} while (0)

/* OK checks a call that returns 0 or -errno. */
#define OK(call)                                                                      \
	do {                                                                          \
		long long ok_rc_ = (long long)(call);                                 \
		CHECK(ok_rc_ >= 0, "%s = %lld (%s)", #call, ok_rc_, vconn_strerror((int)ok_rc_)); \
	} while (0)

static inline const char *env(const char *name)
{
	const char *v = getenv(name);
	if (!v || !*v) {
		fprintf(stderr, "test: %s is not set: run through clib's Go test (go test ./clib)\n", name);
		exit(2);
	}
	return v;
}

/* nodes is a test's two clients: one on node A's agent, one on node B's,
 * where the test listens. */
struct nodes {
	struct vconn_options oa, ob;
	vconn_client *a, *b;
	const char *node, *port;   /* node B's name, the port to listen on (VCONN_NODE_B, VCONN_PORT) */
	char addr[128], laddr[32]; /* "node:port" to dial, ":port" to listen on */
};

/* open_nodes opens both clients, on the agents' sockets sock_a and sock_b
 * (NULL: VCONN_SOCK_A, VCONN_SOCK_B), with shared memory if shm. */
static inline void open_nodes(struct nodes *n, const char *sock_a, const char *sock_b, int shm)
{
	n->node = env("VCONN_NODE_B");
	n->port = env("VCONN_PORT");
	n->oa = (struct vconn_options){.socket = sock_a ? sock_a : env("VCONN_SOCK_A"), .shared_memory = shm};
	n->ob = (struct vconn_options){.socket = sock_b ? sock_b : env("VCONN_SOCK_B"), .shared_memory = shm};
	OK(vconn_client_open(&n->a, &n->oa));
	OK(vconn_client_open(&n->b, &n->ob));
	snprintf(n->addr, sizeof n->addr, "%s:%s", n->node, n->port);
	snprintf(n->laddr, sizeof n->laddr, ":%s", n->port);
}

#endif
