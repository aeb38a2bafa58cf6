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

#endif
