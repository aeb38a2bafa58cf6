/*
 * forkecho: a plain TCP program that forks, for the preload library's
 * tests (it knows nothing of vconns).
 *   forkecho server IP PORT   two children accept on one listening socket
 *                             and echo each line until the peer closes
 *   forkecho client IP PORT   connects, forks: the child echoes a line on
 *                             the inherited socket and exits; then the
 *                             parent echoes one on the same socket
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static void fail(const char *what)
{
	perror(what);
	exit(1);
}

static void serve(int l)
{
	for (;;) {
		int c = accept(l, NULL, NULL);
		if (c < 0)
			fail("accept");
		char buf[4096];
		ssize_t n;
		while ((n = read(c, buf, sizeof buf)) > 0)
			if (write(c, buf, (size_t)n) != n)
				break;
		close(c);
	}
}

/* echo writes msg and reads it back whole. */
static int echo(int s, const char *msg)
{
	size_t n = strlen(msg), got = 0;
	char buf[256];
	if (write(s, msg, n) != (ssize_t)n)
		return -1;
	while (got < n) {
		ssize_t r = read(s, buf + got, n - got);
		if (r <= 0)
			return -1;
		got += (size_t)r;
	}
	return memcmp(buf, msg, n) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return fprintf(stderr, "usage: forkecho server|client IP PORT\n"), 2;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1)
		return fprintf(stderr, "bad IP %s\n", argv[2]), 2;
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		fail("socket");
	if (strcmp(argv[1], "server") == 0) {
		int one = 1;
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(s, (struct sockaddr *)&a, sizeof a) < 0)
			fail("bind");
		if (listen(s, 16) < 0)
			fail("listen");
		for (int i = 0; i < 2; i++)
			if (fork() == 0)
				serve(s);
		close(s);
		while (wait(NULL) > 0)
			;
		return 0;
	}
	if (connect(s, (struct sockaddr *)&a, sizeof a) < 0)
		fail("connect");
	pid_t p = fork();
	if (p < 0)
		fail("fork");
	if (p == 0) {
		if (echo(s, "child\n") != 0)
			fail("child echo");
		printf("child ok\n");
		return 0; /* exit closes the child's copy of the socket */
	}
	int st;
	if (waitpid(p, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return fprintf(stderr, "child failed\n"), 1;
	if (echo(s, "parent\n") != 0)
		fail("parent echo");
	printf("parent ok\n");
	close(s);
	return 0;
}
