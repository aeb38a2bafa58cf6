/* Bridged vconns without a client (vconn.h, vconn_bridge_*): these calls
 * keep no state and start no thread; each opens its own connection to the
 * agent, and a bridged listener is that connection itself, so a program
 * that forks, or knows nothing of this library but the descriptors it
 * returns (the preload library's programs), is served. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define VC_FLAG_BRIDGE 2u
#define BRIDGE_TIMEOUT_MS 30000

/* b_timeout is the bound on one request: the options', else 30 s. */
static int b_timeout(const struct vconn_options *o)
{
	if (!o || o->timeout_ms == 0)
		return BRIDGE_TIMEOUT_MS;
	return o->timeout_ms;
}

static int b_write(int fd, const struct vconn_frame *f)
{
	uint8_t buf[VCONN_HEADER_LEN + 512];
	ssize_t n = vconn_frame_encode(f, buf, sizeof buf);
	if (n < 0) {
		vc_seterr("request too large");
		return -EINVAL;
	}
	if (send(fd, buf, (size_t)n, MSG_NOSIGNAL) != n) {
		int e = errno;
		vc_seterr("write to the agent: %s", strerror(e));
		return -ENOTCONN;
	}
	return 0;
}

/* b_read reads one frame into buf (and the descriptor it carries, if any,
 * into *pass, else -1), waiting at most ms (<0: for ever; 0: not at all). */
static int b_read(int fd, uint8_t *buf, size_t cap, struct vconn_frame *f, int *pass, int ms)
{
	*pass = -1;
	if (ms >= 0) {
		struct pollfd p = {.fd = fd, .events = POLLIN};
		int r;
		while ((r = poll(&p, 1, ms)) < 0 && errno == EINTR)
			;
		if (r == 0) {
			vc_seterr("the agent did not answer within %d ms", ms);
			return ms == 0 ? -EAGAIN : -ETIMEDOUT;
		}
	}
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(4 * sizeof(int))];
	} cm;
	struct iovec iov = {.iov_base = buf, .iov_len = cap};
	struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
	ssize_t n;
	while ((n = recvmsg(fd, &m, MSG_CMSG_CLOEXEC | (ms == 0 ? MSG_DONTWAIT : 0))) < 0 && errno == EINTR)
		;
	if (n < 0) {
		int e = errno;
		if (e == EAGAIN || e == EWOULDBLOCK)
			return -EAGAIN;
		vc_seterr("read from the agent: %s", strerror(e));
		return -ENOTCONN;
	}
	if (n == 0) {
		vc_seterr("the agent closed the connection");
		return -ENOTCONN;
	}
	/* Take every descriptor first, so none leaks whatever follows. */
	for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		int *fds = (int *)CMSG_DATA(c);
		for (size_t i = 0; i < k; i++) {
			if (*pass < 0)
				*pass = fds[i];
			else
				close(fds[i]);
		}
	}
	const char *why = NULL;
	if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || vconn_frame_decode(buf, (size_t)n, f, &why) != 0) {
		vc_seterr("the agent sent a malformed frame (%s)", why ? why : "truncated");
		if (*pass >= 0)
			close(*pass), *pass = -1;
		return -EPROTO;
	}
	return 0;
}

/* b_error turns an Error frame into -errno, with the agent's words. */
static int b_error(const struct vconn_frame *f, const char *what)
{
	vc_seterr("%s: %.*s", what, (int)(f->len > 400 ? 400 : f->len), (const char *)f->payload);
	return vconn_code_errno(f->arg);
}

/* b_hello says hello on a new connection. */
static int b_hello(int fd, int ms)
{
	struct vconn_frame f = {.op = VC_OP_HELLO, .req = 1, .arg = VC_VERSION};
	uint8_t buf[VCONN_HEADER_LEN + 512];
	int pass, err = b_write(fd, &f);
	if (err)
		return err;
	if ((err = b_read(fd, buf, sizeof buf, &f, &pass, ms)) != 0)
		return err;
	if (pass >= 0)
		close(pass);
	if (f.op == VC_OP_ERROR)
		return b_error(&f, "hello");
	if (f.op != VC_OP_OK || f.req != 1) {
		vc_seterr("hello: the agent answered %s", vconn_op_name(f.op));
		return -EPROTO;
	}
	return 0;
}

/* set_flags applies SOCK_NONBLOCK and SOCK_CLOEXEC to a descriptor that
 * arrived close-on-exec and blocking. */
static int set_flags(int fd, int flags)
{
	if (!(flags & SOCK_CLOEXEC) && fcntl(fd, F_SETFD, 0) != 0)
		return -errno;
	if ((flags & SOCK_NONBLOCK) && fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) != 0)
		return -errno;
	return 0;
}

int vconn_bridge_dial(const struct vconn_options *o, const char *addr, int flags)
{
	size_t al = strlen(addr);
	if (al == 0 || al > 300) {
		vc_seterr("dial %s: want host:port", addr);
		return -EINVAL;
	}
	int fd = vc_agent_connect(o);
	if (fd < 0)
		return fd;
	int ms = b_timeout(o), err = b_hello(fd, ms), pass = -1;
	uint8_t buf[VCONN_HEADER_LEN + 512];
	struct vconn_frame f = {.op = VC_OP_DIAL, .req = 2, .flags = VC_FLAG_BRIDGE, .payload = (const uint8_t *)addr, .len = (uint32_t)al};
	if (!err)
		err = b_write(fd, &f);
	if (!err)
		err = b_read(fd, buf, sizeof buf, &f, &pass, ms);
	close(fd); /* the bridge outlives the session */
	if (err)
		return err;
	if (f.op == VC_OP_ERROR) {
		char what[320];
		snprintf(what, sizeof what, "dial %s", addr);
		if (pass >= 0)
			close(pass);
		return b_error(&f, what);
	}
	if (f.op != VC_OP_OK || f.req != 2 || pass < 0) {
		vc_seterr("dial %s: the agent answered %s %s a socket", addr, vconn_op_name(f.op), pass < 0 ? "without" : "with");
		if (pass >= 0)
			close(pass);
		return -EPROTO;
	}
	if ((err = set_flags(pass, flags)) != 0) {
		close(pass);
		return err;
	}
	return pass;
}

int vconn_bridge_listen(const struct vconn_options *o, const char *addr, char *bound, size_t cap)
{
	const char *colon = strrchr(addr, ':');
	char *end;
	unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
	if (!colon || !colon[1] || *end || port == 0 || port > 65535) {
		vc_seterr("listen %s: want :port or host:port with a port of 1..65535", addr);
		return -EINVAL;
	}
	int fd = vc_agent_connect(o);
	if (fd < 0)
		return fd;
	int ms = b_timeout(o), err = b_hello(fd, ms), pass = -1;
	uint8_t buf[VCONN_HEADER_LEN + 512];
	struct vconn_frame f = {.op = VC_OP_LISTEN, .req = 2, .flags = VC_FLAG_BRIDGE, .arg = (uint32_t)port};
	if (!err)
		err = b_write(fd, &f);
	if (!err)
		err = b_read(fd, buf, sizeof buf, &f, &pass, ms);
	if (pass >= 0)
		close(pass);
	if (!err && f.op == VC_OP_ERROR) {
		char what[320];
		snprintf(what, sizeof what, "listen %s", addr);
		err = b_error(&f, what);
	} else if (!err && (f.op != VC_OP_OK || f.req != 2)) {
		vc_seterr("listen %s: the agent answered %s", addr, vconn_op_name(f.op));
		err = -EPROTO;
	}
	if (err) {
		close(fd);
		return err;
	}
	if (bound && cap > 0)
		snprintf(bound, cap, "%.*s", (int)f.len, (const char *)f.payload);
	return fd;
}

int vconn_bridge_accept(int lfd, int flags, char *remote, size_t cap)
{
	uint8_t buf[VCONN_HEADER_LEN + 512];
	struct vconn_frame f;
	int nb = fcntl(lfd, F_GETFL);
	if (nb < 0)
		return -errno;
	for (;;) {
		int pass, err = b_read(lfd, buf, sizeof buf, &f, &pass, (nb & O_NONBLOCK) ? 0 : -1);
		if (err)
			return err == -ENOTCONN ? -ECONNABORTED : err;
		if (f.op == VC_OP_ACCEPT && pass >= 0) {
			if ((err = set_flags(pass, flags)) != 0) {
				close(pass);
				return err;
			}
			if (remote && cap > 0)
				snprintf(remote, cap, "%.*s", (int)f.len, (const char *)f.payload);
			return pass;
		}
		if (pass >= 0)
			close(pass);
		if (f.op == VC_OP_ERROR)
			return b_error(&f, "accept");
		/* Anything else is not for a bridged listener: skip it. */
	}
}
