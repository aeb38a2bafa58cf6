/* The session on the allocation's socket (docs/protocol.md §1, §3): the
 * frames it writes, the requests waiting for their replies, who reads the
 * socket (vc_cv_wait, lead, the background reader), and its failure. One
 * mutex (c->mu) guards a client's state and one condition variable wakes
 * every waiter: a client holds few vconns, and simple locking beats fast
 * locking here. What the agent's other frames mean, and what a failure
 * does to vconns and listeners, is the hooks' (internal.h): this file
 * never looks inside a vconn or a listener. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct pending {
	struct pending *next;
	uint32_t req;
	int done, err, discard;
	vconn *send_of; /* an asynchronous send or grant: the reply settles it */
	void (*left)(void *); /* a request its caller left: runs when it is freed (mu held) */
	void *left_arg;
	struct vconn_frame f;
	uint8_t *payload;
	int fds[3], nfds;
};

/* Deadlines on CLOCK_MONOTONIC. */
int vc_deadline(int ms, struct timespec *ts)
{
	if (ms < 0)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
	return 1;
}

int vc_remaining_ms(const struct timespec *ts)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	long long ms = (long long)(ts->tv_sec - now.tv_sec) * 1000 + (ts->tv_nsec - now.tv_nsec) / 1000000;
	return ms < 0 ? 0 : ms > 1000000000 ? 1000000000 : (int)ms;
}

/* sleep waits on c->cv (mu held) until woken or the deadline: -ETIMEDOUT. */
static int sleep_cv(vconn_client *c, const struct timespec *dl)
{
	if (!dl) {
		pthread_cond_wait(&c->cv, &c->mu);
		return 0;
	}
	return pthread_cond_timedwait(&c->cv, &c->mu, dl) == ETIMEDOUT ? -ETIMEDOUT : 0;
}

static void kick(vconn_client *c)
{
	uint64_t one = 1;
	if (write(c->kick, &one, sizeof one) < 0) { /* full: a kick is pending anyway */
	}
}

/* vc_notify wakes the waiters of a change made outside the socket's frames
 * (mu held), the leader too: its poll does not see the condition. */
void vc_notify(vconn_client *c)
{
	pthread_cond_broadcast(&c->cv);
	if (c->leader == LEAD_APP)
		kick(c);
}

static int read_frame(vconn_client *c);

/* lead reads the socket for a waiting thread of the program (mu held,
 * released meanwhile) until a frame came, a kick or the deadline. The
 * thread that waits for a reply reads it itself: a reader thread that
 * hands each frame to the waiter over c->cv cost a second thread's
 * wake-up a message, and on a virtual machine waking a core that went
 * idle costs tens of microseconds (bench/results/e6-wakeups.md). */
static int lead(vconn_client *c, const struct timespec *dl)
{
	c->leader = LEAD_APP;
	pthread_mutex_unlock(&c->mu);
	struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->kick, .events = POLLIN}};
	int ms = dl ? vc_remaining_ms(dl) : -1;
	int n = ms == 0 ? 0 : poll(p, 2, ms);
	if (n > 0 && (p[1].revents & POLLIN)) {
		uint64_t k;
		if (read(c->kick, &k, sizeof k) < 0) { /* drained by another */
		}
	}
	if (n > 0 && p[0].revents)
		read_frame(c);
	pthread_mutex_lock(&c->mu);
	c->leader = LEAD_NONE;
	c->kicked = 0;
	if (c->waiters)
		pthread_cond_broadcast(&c->cv); /* one of them reads next */
	return n == 0 ? -ETIMEDOUT : 0; /* n is 0 only when a deadline passed */
}

/* vc_cv_wait waits (mu held) for what the socket or another thread brings,
 * until the deadline: -ETIMEDOUT. The first waiter reads the socket
 * itself (lead); the others sleep on c->cv. Programs that asked for
 * descriptors or non-blocking mode (c->async) leave the socket to the
 * background reader, which then reads at once. */
int vc_cv_wait(vconn_client *c, const struct timespec *dl)
{
	c->app_gen++;
	if (c->err)
		return c->err; /* nothing more comes */
	if (!c->async && c->leader == LEAD_NONE)
		return lead(c, dl);
	if (!c->async && c->leader == LEAD_BG && !c->kicked) {
		c->kicked = 1; /* the background reader stands by: this thread reads next */
		kick(c);
	}
	c->waiters++;
	int err = sleep_cv(c, dl);
	c->waiters--;
	return err;
}

unsigned long vc_client_bg_frames(vconn_client *c)
{
	pthread_mutex_lock(&c->mu);
	unsigned long n = c->bg_frames;
	pthread_mutex_unlock(&c->mu);
	return n;
}

/* vc_set_async makes the background reader the socket's only reader (mu
 * held): a program polling descriptors waits outside vc_cv_wait. */
void vc_set_async(vconn_client *c)
{
	if (!c->async) {
		c->async = 1;
		pthread_cond_signal(&c->bgcv);
		if (c->leader == LEAD_APP)
			kick(c);
	}
}

static void free_pending(struct pending *p)
{
	if (p->left)
		p->left(p->left_arg);
	for (int i = 0; i < p->nfds; i++)
		close(p->fds[i]);
	free(p->payload);
	free(p);
}

static void unlink_pending(vconn_client *c, struct pending *p)
{
	for (struct pending **pp = &c->pending; *pp; pp = &(*pp)->next)
		if (*pp == p) {
			*pp = p->next;
			return;
		}
}

/* vc_fail breaks the session (mu held): every waiter and vconn fails. */
void vc_fail(vconn_client *c, int err, const char *msg)
{
	if (c->err)
		return;
	c->err = err;
	snprintf(c->errmsg, sizeof c->errmsg, "%s", msg);
	for (struct pending *p = c->pending, *next; p; p = next) {
		next = p->next;
		if (p->done)
			continue; /* answered already: its answer stands */
		p->done = 1;
		p->err = err;
		if (p->send_of) {
			c->hooks->settled(p->send_of, 0, NULL);
			p->send_of = NULL;
		}
	}
	/* Waiters free their own; nobody waits for the discarded ones. */
	for (struct pending **pp = &c->pending; *pp;) {
		struct pending *p = *pp;
		if (p->discard) {
			*pp = p->next;
			free_pending(p);
		} else {
			pp = &p->next;
		}
	}
	c->hooks->broken(c, err, msg);
	vc_notify(c);
}

int vc_write_frame(vconn_client *c, const struct vconn_frame *f)
{
	pthread_mutex_lock(&c->wmu);
	ssize_t n = vconn_frame_encode(f, c->wbuf, sizeof c->wbuf);
	if (n < 0) {
		pthread_mutex_unlock(&c->wmu);
		return (int)n;
	}
	ssize_t w;
	do
		w = send(c->fd, c->wbuf, (size_t)n, MSG_NOSIGNAL);
	while (w < 0 && errno == EINTR);
	int e = errno;
	pthread_mutex_unlock(&c->wmu);
	if (w != n) {
		pthread_mutex_lock(&c->mu);
		vc_fail(c, -ENOTCONN, w < 0 ? strerror(e) : "short write to the agent");
		pthread_mutex_unlock(&c->mu);
		vc_seterr("write to the agent: %s", w < 0 ? strerror(e) : "short write");
		return -ENOTCONN;
	}
	return 0;
}

/* add_pending registers a request (mu held). */
static struct pending *add_pending(vconn_client *c, struct vconn_frame *f)
{
	struct pending *p = calloc(1, sizeof *p);
	if (!p)
		return NULL;
	if (++c->next_req == 0)
		++c->next_req;
	p->req = f->req = c->next_req;
	p->next = c->pending;
	c->pending = p;
	return p;
}

void vc_reply_free(struct vc_reply *r)
{
	for (int i = 0; i < r->nfds; i++)
		close(r->fds[i]);
	free(r->payload);
	memset(r, 0, sizeof *r);
}

/* vc_call sends a request and waits for its reply, for at most ms. */
int vc_call(vconn_client *c, struct vconn_frame *f, int ms, struct vc_reply *out)
{
	return vc_call_or_leave(c, f, ms, out, NULL);
}

/* vc_call_or_leave sends a request and waits for its reply, for at most
 * ms; with lv, a request that went out unanswered stays registered, to
 * be freed (and lv->fn run) by its reply or the session's end. */
int vc_call_or_leave(vconn_client *c, struct vconn_frame *f, int ms, struct vc_reply *out, struct vc_leave *lv)
{
	struct timespec ts;
	const struct timespec *dl = vc_deadline(ms, &ts) ? &ts : NULL;
	pthread_mutex_lock(&c->mu);
	if (c->err) {
		int e = c->err;
		vc_seterr("%s", c->errmsg);
		pthread_mutex_unlock(&c->mu);
		return e;
	}
	struct pending *p = add_pending(c, f);
	pthread_mutex_unlock(&c->mu);
	if (!p)
		return -ENOMEM;
	int err = vc_write_frame(c, f);
	int sent = !err;
	pthread_mutex_lock(&c->mu);
	while (!err && !p->done)
		err = vc_cv_wait(c, dl);
	if (!p->done && err == -ETIMEDOUT)
		vc_seterr("%s: no reply from the agent in %d ms", vconn_op_name(f->op), ms);
	if (!p->done && sent && lv) {
		p->discard = 1; /* settle, vc_fail or vc_session_end frees it */
		p->left = lv->fn;
		p->left_arg = lv->arg;
		lv->left = 1;
		pthread_mutex_unlock(&c->mu);
		return err;
	}
	unlink_pending(c, p);
	if (p->done && !p->err && out) {
		out->f = p->f;
		out->payload = p->payload;
		out->f.payload = p->payload;
		memcpy(out->fds, p->fds, sizeof p->fds);
		out->nfds = p->nfds;
		p->payload = NULL;
		p->nfds = 0;
	}
	if (p->done) {
		err = p->err;
		if (err && p->err != c->err)
			vc_seterr("%s: %.*s", vconn_op_name(f->op), (int)p->f.len, p->payload ? (char *)p->payload : "");
		else if (err)
			vc_seterr("%s", c->errmsg);
	}
	pthread_mutex_unlock(&c->mu);
	free_pending(p);
	return err;
}

/* vc_send_discard sends a request whose reply nobody waits for. */
void vc_send_discard(vconn_client *c, struct vconn_frame *f)
{
	pthread_mutex_lock(&c->mu);
	struct pending *p = c->err ? NULL : add_pending(c, f);
	if (p)
		p->discard = 1;
	pthread_mutex_unlock(&c->mu);
	if (p)
		vc_write_frame(c, f);
}

int vc_add_send(vconn_client *c, struct vconn_frame *f, vconn *v)
{
	struct pending *p = add_pending(c, f);
	if (!p)
		return -ENOMEM;
	p->send_of = v;
	p->discard = 1;
	return 0;
}

void vc_close_later(vconn_client *c, uint32_t h)
{
	struct vconn_frame cl = {.op = VC_OP_CLOSE, .handle = h};
	struct pending *p = add_pending(c, &cl);
	if (p) {
		p->discard = 1;
		/* Written by the reader without mu: see read_frame. */
		p->f = cl;
		p->f.op = VC_OP_CLOSE;
	}
}

void vc_session_forget(vconn_client *c, vconn *v)
{
	for (struct pending *p = c->pending; p; p = p->next)
		if (p->send_of == v)
			p->send_of = NULL;
}

/* settle hands the agent's reply f to its request (mu held); fds are its
 * descriptors, which it takes. */
static void settle(vconn_client *c, const struct vconn_frame *f, int *fds, int nfds)
{
	struct pending *p;
	for (p = c->pending; p && p->req != f->req; p = p->next)
		;
	if (!p || p->done) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		return;
	}
	p->done = 1;
	p->f = *f;
	p->f.payload = NULL;
	if (f->op == VC_OP_ERROR)
		p->err = vconn_code_errno(f->arg);
	if (f->len) {
		p->payload = malloc((size_t)f->len + 1);
		if (p->payload) {
			memcpy(p->payload, f->payload, f->len);
			p->payload[f->len] = 0;
		} else {
			p->err = -ENOMEM;
		}
	}
	for (int i = 0; i < nfds && i < 3; i++)
		p->fds[p->nfds++] = fds[i];
	for (int i = 3; i < nfds; i++)
		close(fds[i]);
	if (p->send_of) {
		c->hooks->settled(p->send_of, p->err, f);
		p->discard = 1;
	}
	if (p->discard) {
		unlink_pending(c, p);
		free_pending(p);
	}
}

/* dispatch handles one frame from the agent (mu held): a reply settles
 * its request, the hooks take the rest; fds are its descriptors, which
 * it takes. */
static void dispatch(vconn_client *c, const struct vconn_frame *f, int *fds, int nfds)
{
	if (f->req != 0 && (f->op == VC_OP_OK || f->op == VC_OP_ERROR))
		settle(c, f, fds, nfds);
	else
		c->hooks->frame(c, f, fds, nfds);
}

/* read_frame reads one frame, if one is there, and dispatches it; the
 * caller leads (mu not held). 1: it did; 0: none was there; or the
 * session's error once it broke. */
static int read_frame(vconn_client *c)
{
	union {
		char b[CMSG_SPACE(3 * sizeof(int))];
		struct cmsghdr align;
	} ctl;
	struct iovec iov = {c->rbuf, VCONN_MAX_FRAME + 1};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.b, .msg_controllen = sizeof ctl.b};
	ssize_t n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	int fds[8], nfds = 0;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
			if (nfds < 8)
				fds[nfds++] = fd;
			else
				close(fd);
		}
	}
	struct vconn_frame f;
	const char *why = NULL;
	int err = n <= 0 ? -ENOTCONN : (mh.msg_flags & MSG_TRUNC) ? (why = "too-big", -EPROTO) : vconn_frame_decode(c->rbuf, (size_t)n, &f, &why);
	if (err) {
		for (int i = 0; i < nfds; i++)
			close(fds[i]);
		char msg[128];
		if (n <= 0)
			snprintf(msg, sizeof msg, "%s", n == 0 ? "the agent closed the connection" : strerror(errno));
		else
			snprintf(msg, sizeof msg, "protocol error: the agent sent a malformed frame (%s)", why);
		pthread_mutex_lock(&c->mu);
		vc_fail(c, n <= 0 ? -ENOTCONN : -EPROTO, msg);
		err = c->err;
		pthread_mutex_unlock(&c->mu);
		return err;
	}
	pthread_mutex_lock(&c->mu);
	/* An Accept nobody takes registers a discarded Close to send:
	 * find it after dispatch, and send it outside mu. */
	uint32_t before = c->next_req;
	dispatch(c, &f, fds, nfds);
	struct vconn_frame cl = {0};
	if (c->next_req != before && c->pending && c->pending->req == c->next_req && c->pending->discard) {
		cl = c->pending->f;
		cl.req = c->pending->req;
	}
	pthread_cond_broadcast(&c->cv);
	pthread_mutex_unlock(&c->mu);
	if (cl.op == VC_OP_CLOSE)
		vc_write_frame(c, &cl);
	return 1;
}

/* standby is how long the background reader leaves the socket to the
 * program's threads after one waited (doubling while they keep waiting,
 * up to STANDBY_MAX_MS): it reads for them when none waits, so that
 * replies to sends nobody waits for, and a program blocked writing, are
 * not left unread; waking it for each wait would cost what lead saves. */
#define STANDBY_MIN_MS 2
#define STANDBY_MAX_MS 64

static void standby(vconn_client *c, int ms)
{
	struct timespec ts;
	vc_deadline(ms, &ts);
	pthread_cond_timedwait(&c->bgcv, &c->mu, &ts);
}

/* reader is the background reader: the socket's reader while no thread of
 * the program waits in vc_cv_wait, and always once c->async. */
static void *reader(void *arg)
{
	vconn_client *c = arg;
	unsigned seen = 0;
	int wait_ms = STANDBY_MIN_MS;
	pthread_mutex_lock(&c->mu);
	while (!c->err && !c->closing) {
		if (!c->async && (c->leader != LEAD_NONE || c->waiters > 0 || c->app_gen != seen)) {
			seen = c->app_gen;
			standby(c, wait_ms);
			wait_ms = wait_ms * 2 > STANDBY_MAX_MS ? STANDBY_MAX_MS : wait_ms * 2;
			continue;
		}
		if (c->leader != LEAD_NONE) { /* async now: the program's leader is kicked out */
			standby(c, STANDBY_MIN_MS);
			continue;
		}
		wait_ms = STANDBY_MIN_MS;
		c->leader = LEAD_BG;
		pthread_mutex_unlock(&c->mu);
		struct pollfd p[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = c->kick, .events = POLLIN}};
		int n = poll(p, 2, -1);
		if (n > 0 && (p[1].revents & POLLIN)) {
			uint64_t k;
			if (read(c->kick, &k, sizeof k) < 0) { /* drained by another */
			}
		}
		int got = n > 0 && p[0].revents ? read_frame(c) : 0;
		pthread_mutex_lock(&c->mu);
		if (got == 1)
			c->bg_frames++;
		c->leader = LEAD_NONE;
		c->kicked = 0;
		if (c->waiters)
			pthread_cond_broadcast(&c->cv);
	}
	pthread_mutex_unlock(&c->mu);
	return NULL;
}

int vc_session_init(vconn_client *c, int fd, const struct vc_session_hooks *hooks)
{
	c->hooks = hooks;
	pthread_mutex_init(&c->mu, NULL);
	pthread_mutex_init(&c->wmu, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&c->cv, &ca);
	pthread_cond_init(&c->bgcv, &ca);
	pthread_condattr_destroy(&ca);
	c->fd = fd;
	c->kick = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	c->rbuf = malloc(VCONN_MAX_FRAME + 1);
	if (c->kick < 0 || !c->rbuf)
		return -ENOMEM;
	if (pthread_create(&c->reader, NULL, reader, c) != 0)
		return -EAGAIN;
	c->reader_started = 1;
	return 0;
}

void vc_session_end(vconn_client *c)
{
	pthread_mutex_lock(&c->mu);
	c->closing = 1;
	pthread_cond_signal(&c->bgcv);
	pthread_mutex_unlock(&c->mu);
	shutdown(c->fd, SHUT_RDWR);
	if (c->reader_started)
		pthread_join(c->reader, NULL);
	pthread_mutex_lock(&c->mu); /* the requests left run their fn with it, the kick still open */
	for (struct pending *p = c->pending, *n; p; p = n) {
		n = p->next;
		free_pending(p);
	}
	c->pending = NULL;
	pthread_mutex_unlock(&c->mu);
	close(c->fd);
	if (c->kick >= 0)
		close(c->kick);
	free(c->rbuf);
}

void vc_session_free(vconn_client *c)
{
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->wmu);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->bgcv);
	free(c);
}
