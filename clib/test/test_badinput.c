/* A client that sends malformed frames gets a clear error (Error,
 * CodeBadRequest, naming the fault) and its connection closed; the agent
 * is unaffected: a well-behaved client of the same allocation then works. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"

static int raw_connect(const char *path)
{
	int fd = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strncpy(sa.sun_path, path, sizeof sa.sun_path - 1);
	CHECK(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "connect %s", path);
	return fd;
}

static void send_frame(int fd, const struct vconn_frame *f)
{
	uint8_t b[VCONN_MAX_FRAME];
	ssize_t n = vconn_frame_encode(f, b, sizeof b);
	CHECK(n > 0 && send(fd, b, (size_t)n, 0) == n, "send");
}

/* expect_bad reads the agent's answer: an Error of CodeBadRequest for
 * req, then the end of the connection. */
static void expect_bad(int fd, uint32_t req, const char *what)
{
	static uint8_t b[VCONN_MAX_FRAME + 1];
	ssize_t n = recv(fd, b, sizeof b, 0);
	struct vconn_frame f;
	const char *why;
	CHECK(n > 0 && vconn_frame_decode(b, (size_t)n, &f, &why) == 0, "%s: the agent's answer (%zd bytes)", what, n);
	CHECK(f.op == 14 && f.arg == 1 && f.req == req, "%s: got %s code %u req %u, want error 1 req %u", what,
	      vconn_op_name(f.op), f.arg, f.req, req);
	printf("%s: error %u (%s): %.*s\n", what, f.arg, vconn_strerror(vconn_code_errno(f.arg)), (int)f.len, (const char *)f.payload);
	CHECK(recv(fd, b, sizeof b, 0) == 0, "%s: the agent keeps the connection open", what);
	close(fd);
}

static int hello(const char *path)
{
	int fd = raw_connect(path);
	struct vconn_frame h = {.op = 1, .req = 1, .arg = 1};
	send_frame(fd, &h);
	static uint8_t b[VCONN_MAX_FRAME + 1];
	struct vconn_frame f;
	ssize_t n = recv(fd, b, sizeof b, 0);
	CHECK(n > 0 && vconn_frame_decode(b, (size_t)n, &f, NULL) == 0 && f.op == 13, "hello");
	return fd;
}

int main(void)
{
	const char *sock = env("VCONN_SOCK_A");
	/* Raw datagrams, after a good hello. */
	struct {
		const char *what;
		uint8_t b[40];
		size_t n;
		uint32_t req;
	} raw[] = {
		{"short datagram", {1, 4, 0, 0, 0, 0, 0, 9}, 8, 9},
		{"version 2", {2, 4, 0, 0, 0, 0, 0, 3}, 28, 3},
		{"unknown op", {1, 99, 0, 0, 0, 0, 0, 4}, 28, 4},
		{"unknown flag", {1, 4, 0x80, 0, 0, 0, 0, 5}, 28, 5},
		{"length mismatch", {1, 4, 0, 0, 0, 0, 0, 6, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9, 'x'}, 29, 6},
		/* An Error with req 0 and handle 0 is the agent's last frame: a
		 * request whose answer would be one ends the session. */
		{"grant on handle 0", {1, 5, 0, 0, 0, 0, 0x10, 0x92, 0, 0, 0, 0, 0, 0, 0, 1}, 28, 0},
		{"dial with req 0", {1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 'a', ':', '1'}, 31, 0},
	};
	for (size_t i = 0; i < sizeof raw / sizeof raw[0]; i++) {
		int fd = hello(sock);
		CHECK(send(fd, raw[i].b, raw[i].n, 0) == (ssize_t)raw[i].n, "send");
		expect_bad(fd, raw[i].req, raw[i].what);
	}
	/* Well-formed frames out of place. */
	int fd = raw_connect(sock);
	struct vconn_frame f = {.op = 3, .req = 7, .payload = (const uint8_t *)"node-b:80", .len = 9};
	send_frame(fd, &f);
	expect_bad(fd, 7, "dial before hello");
	fd = hello(sock);
	struct vconn_frame ok = {.op = 13, .req = 8};
	send_frame(fd, &ok);
	expect_bad(fd, 8, "a reply sent as a request");
	fd = hello(sock);
	struct vconn_frame lis = {.op = 2, .req = 9, .arg = 70000};
	send_frame(fd, &lis);
	{
		static uint8_t b[VCONN_MAX_FRAME + 1];
		ssize_t n = recv(fd, b, sizeof b, 0);
		struct vconn_frame r;
		CHECK(n > 0 && vconn_frame_decode(b, (size_t)n, &r, NULL) == 0 && r.op == 14 && r.arg == 1 && r.req == 9,
		      "listen on port 70000: a bad request");
		printf("listen on port 70000: %.*s\n", (int)r.len, (const char *)r.payload);
		close(fd); /* a bad argument keeps the session: not tested further */
	}
	/* The library's own client, on the same allocation, still works. */
	struct nodes nd;
	open_nodes(&nd, sock, NULL, 0);
	vconn_client *a = nd.a, *b = nd.b;
	const char *addr = nd.addr, *laddr = nd.laddr;
	vconn_listener *l;
	OK(vconn_listen(b, laddr, &l));
	vconn *va, *vb;
	OK(vconn_dial(a, addr, &va));
	OK(vconn_accept(l, &vb));
	OK(vconn_send(va, "still here", 10));
	char buf[16];
	CHECK(vconn_recv(vb, buf, sizeof buf, NULL, NULL) == 10 && memcmp(buf, "still here", 10) == 0, "after the bad clients");
	OK(vconn_close(va));
	OK(vconn_close(vb));
	OK(vconn_listener_close(l));
	vconn_client_close(a);
	vconn_client_close(b);
	printf("ok\n");
	return 0;
}
