/*
 * ladder_tcp: benchmark E6's program over plain POSIX TCP sockets
 * (ladder.h says what it speaks); it knows nothing of vconns. test/ladder
 * runs it as is (the tcp-c path) and under librdmavisor-preload.so (the
 * preload path).
 *   ladder_tcp server IP:PORT   listens (PORT 0: any), serves one client
 *   ladder_tcp client IP:PORT   connects, runs the commands on stdin
 * A message is a fixed-size write, read back with reads until it is whole.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "ladder.h"

static int put(void *h, const void *b, size_t n)
{
	int fd = *(int *)h;
	for (size_t d = 0; d < n;) {
		ssize_t w = write(fd, (const char *)b + d, n - d);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			fprintf(stderr, "error: write: %s\n", strerror(errno));
			return -1;
		}
		d += (size_t)w;
	}
	return 0;
}

static int get(void *h, void *b, size_t n)
{
	int fd = *(int *)h;
	for (size_t d = 0; d < n;) {
		ssize_t r = read(fd, (char *)b + d, n - d);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			fprintf(stderr, "error: read: %s\n", strerror(errno));
		if (r == 0 && d > 0)
			fprintf(stderr, "error: the stream ended inside a message\n");
		if (r <= 0)
			return -1;
		d += (size_t)r;
	}
	return 0;
}

static void fail(const char *what)
{
	fprintf(stderr, "error: %s: %s\n", what, strerror(errno));
	exit(1);
}

int main(int argc, char **argv)
{
	char *colon = argc == 3 ? strrchr(argv[2], ':') : NULL;
	if (colon == NULL || (strcmp(argv[1], "server") != 0 && strcmp(argv[1], "client") != 0)) {
		fprintf(stderr, "usage: ladder_tcp server|client IP:PORT\n");
		return 2;
	}
	signal(SIGPIPE, SIG_IGN);
	*colon = 0;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1) {
		fprintf(stderr, "bad IP %s\n", argv[2]);
		return 2;
	}
	int s = socket(AF_INET, SOCK_STREAM, 0), fd, one = 1;
	if (s < 0)
		fail("socket");
	if (strcmp(argv[1], "server") == 0) {
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(s, (struct sockaddr *)&a, sizeof a) < 0)
			fail("bind");
		if (listen(s, 4) < 0)
			fail("listen");
		socklen_t len = sizeof a;
		if (getsockname(s, (struct sockaddr *)&a, &len) < 0)
			fail("getsockname");
		printf("ready %s:%d\n", argv[2], ntohs(a.sin_port));
		fflush(stdout);
		if ((fd = accept(s, NULL, NULL)) < 0)
			fail("accept");
	} else {
		if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
			fail("connect");
		fd = s;
	}
	/* What a latency-minded TCP program does; the preload library takes
	 * (and ignores) it on a vconn. */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
	struct ladder_io io = {.put = put, .get = get, .h = &fd};
	if (strcmp(argv[1], "server") == 0)
		ladder_serve(&io);
	else
		ladder_client(&io);
	close(fd);
	return 0;
}
