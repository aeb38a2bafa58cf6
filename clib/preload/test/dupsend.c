/*
 * dupsend: a plain TCP program that copies its socket's descriptor and
 * sends a file with sendfile, for the preload library's tests (it knows
 * nothing of vconns).
 *   dupsend dup IP PORT        connects to an echo server; dup, dup2 and
 *                              dup3 (O_CLOEXEC) copy the socket, and each
 *                              copy echoes a line and names the peer; the
 *                              copies are closed one by one, the others
 *                              still echoing after each close
 *   dupsend sendfile IP PORT FILE
 *                              connects and sends FILE with sendfile, in
 *                              pieces from offsets it chooses, then closes;
 *                              the peer checks every byte
 * It prints "dup ok" or "sendfile ok N" (bytes sent) and exits 0, or says
 * what failed and exits 1.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void fail(const char *what)
{
	perror(what);
	exit(1);
}

static void failf(const char *what, int fd)
{
	fprintf(stderr, "%s (fd %d)\n", what, fd);
	exit(1);
}

/* echo writes msg on fd and reads it back whole on fd. */
static void echo(int fd, const char *msg)
{
	size_t n = strlen(msg), got = 0;
	char buf[256];
	if (write(fd, msg, n) != (ssize_t)n)
		fail("write");
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r <= 0)
			failf(r == 0 ? "echo: end of file" : "echo: read failed", fd);
		got += (size_t)r;
	}
	if (memcmp(buf, msg, n) != 0)
		failf("echo: other bytes back", fd);
}

/* peer_is checks that getpeername on fd names a. */
static void peer_is(int fd, const struct sockaddr_in *a)
{
	struct sockaddr_in p;
	socklen_t n = sizeof p;
	memset(&p, 0, sizeof p);
	if (getpeername(fd, (struct sockaddr *)&p, &n) != 0)
		fail("getpeername");
	if (p.sin_family != AF_INET || p.sin_port != a->sin_port || p.sin_addr.s_addr != a->sin_addr.s_addr)
		failf("getpeername names another peer", fd);
}

static int dups(const struct sockaddr_in *a)
{
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		fail("socket");
	if (connect(s, (const struct sockaddr *)a, sizeof *a) < 0)
		fail("connect");
	int d = dup(s);
	if (d < 0)
		fail("dup");
	int d2 = dup2(s, 100);
	if (d2 != 100)
		fail("dup2");
	int d3 = dup3(s, 101, O_CLOEXEC);
	if (d3 != 101)
		fail("dup3");
	if (!(fcntl(d3, F_GETFD) & FD_CLOEXEC) || (fcntl(d, F_GETFD) & FD_CLOEXEC))
		failf("close-on-exec: set on dup3's copy only", d3);
	int fd[] = {s, d, d2, d3};
	char line[64];
	for (int i = 0; i < 4; i++) {
		peer_is(fd[i], a);
		snprintf(line, sizeof line, "on copy %d\n", i);
		echo(fd[i], line);
	}
	/* Written on one copy, read on another: one socket. */
	if (write(d2, "across\n", 7) != 7)
		fail("write");
	char buf[8];
	size_t got = 0;
	while (got < 7) {
		ssize_t r = read(d, buf + got, 7 - got);
		if (r <= 0)
			failf("across: read failed", d);
		got += (size_t)r;
	}
	if (memcmp(buf, "across\n", 7) != 0)
		failf("across: other bytes back", d);
	/* Closed one by one, the original first: the vconn lives while one
	 * copy does. */
	for (int i = 0; i < 3; i++) {
		if (close(fd[i]) != 0)
			fail("close");
		for (int j = i + 1; j < 4; j++) {
			peer_is(fd[j], a);
			snprintf(line, sizeof line, "copy %d after closing %d\n", j, i);
			echo(fd[j], line);
		}
	}
	if (close(d3) != 0)
		fail("close");
	printf("dup ok\n");
	return 0;
}

static int send_file(const struct sockaddr_in *a, const char *path)
{
	int f = open(path, O_RDONLY);
	if (f < 0)
		fail(path);
	struct stat st;
	if (fstat(f, &st) != 0)
		fail("fstat");
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (s < 0)
		fail("socket");
	if (connect(s, (const struct sockaddr *)a, sizeof *a) < 0)
		fail("connect");
	/* The first half through the file's own offset (a NULL offset), the
	 * rest from an offset of ours, in pieces of odd sizes. */
	off_t half = st.st_size / 2, sent = 0;
	while (sent < half) {
		ssize_t n = sendfile(s, f, NULL, (size_t)(half - sent));
		if (n <= 0)
			fail("sendfile");
		sent += n;
	}
	if (lseek(f, 0, SEEK_CUR) != half)
		failf("sendfile left the file's offset elsewhere", f);
	off_t off = half;
	while (off < st.st_size) {
		size_t piece = (size_t)(st.st_size - off);
		if (piece > 100003)
			piece = 100003;
		ssize_t n = sendfile(s, f, &off, piece);
		if (n <= 0)
			fail("sendfile");
		sent += n;
	}
	if (lseek(f, 0, SEEK_CUR) != half)
		failf("sendfile with an offset moved the file's", f);
	close(f);
	if (close(s) != 0)
		fail("close");
	printf("sendfile ok %lld\n", (long long)sent);
	return 0;
}

int main(int argc, char **argv)
{
	int file = argc == 5 && strcmp(argv[1], "sendfile") == 0;
	if (!file && (argc != 4 || strcmp(argv[1], "dup") != 0))
		return fprintf(stderr, "usage: dupsend dup IP PORT | dupsend sendfile IP PORT FILE\n"), 2;
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[3]))};
	if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1)
		return fprintf(stderr, "bad IP %s\n", argv[2]), 2;
	return file ? send_file(&a, argv[4]) : dups(&a);
}
