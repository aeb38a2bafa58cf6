/* The client: a session on the allocation's socket, who reads it (cv_wait),
 * vconns and listeners (docs/protocol.md §1, §3). One mutex (c->mu) guards
 * a client's state and one condition variable wakes every waiter: a client
 * holds few vconns, and simple locking beats fast locking here. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* Messages of a vconn the agent may push ahead of the application's reads
 * (the receive window); more is granted each time half is consumed. */
#define RECV_WINDOW 32
#define CLOSE_DRAIN_MS 5000
#define DEFAULT_TIMEOUT_MS 30000

static _Thread_local char errbuf[512];

void vc_seterr(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof errbuf, fmt, ap);
	va_end(ap);
}

const char *vconn_errmsg(void) { return errbuf; }

struct msg {
	struct msg *next;
	uint32_t len, imm;
	int has_imm;
	uint8_t data[];
};

struct pending {
	struct pending *next;
	uint32_t req;
	int done, err, discard;
	vconn *send_of; /* an asynchronous send or grant: the reply settles it */
	struct vconn_frame f;
	uint8_t *payload;
	int fds[3], nfds;
};

/* Who reads the session's socket (vconn_client.leader): see cv_wait. */
enum { LEAD_NONE, LEAD_BG, LEAD_APP };

struct vconn_client {
	int fd;
	pthread_t reader;
	int reader_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	/* The socket has one reader at a time (leader; guarded by mu): a
	 * thread of the program waiting in cv_wait, or the background
	 * reader when none waits. kick (an eventfd) wakes the leader from its
	 * poll; rbuf is the leader's frame buffer. */
	int leader, waiters, kicked, kick, closing;
	int async;        /* a descriptor or non-blocking mode was asked for: the background reader always reads */
	unsigned app_gen; /* counts the program's waits: the background reader stands by while it moves */
	pthread_cond_t bgcv;
	uint8_t *rbuf;
	unsigned long bg_frames; /* frames the background reader read: vc_client_bg_frames */
	int err; /* the session broke: <0; guarded by mu */
	char errmsg[256];
	uint32_t next_req;
	struct pending *pending;
	vconn *vconns;
	vconn_listener *lns;
	struct vconn_hello_info info;
	uint64_t features; /* what the agent offers (Hello's OK, arg2) */
	int want_shm, timeout_ms;
	pthread_mutex_t wmu; /* serialises writes; guards wbuf */
	uint8_t wbuf[VCONN_MAX_FRAME];
};

/* A region this side exported in a memfd it maps (VC_FLAG_MEMFD). */
struct vc_region {
	struct vc_region *next;
	uint32_t id;
	uint8_t *mem;
	size_t size;
};

struct vconn {
	vconn_client *c;
	vconn *next;  /* in c->vconns */
	vconn *qnext; /* in a listener's accept queue */
	uint32_t h, max_msg;
	int transport;
	char remote[256];
	struct msg *qhead, *qtail;
	struct msg *cur; /* the message a stream read is in */
	size_t curoff;
	int eof, err, send_err, closed;
	int users; /* calls inside: vconn_close waits for them to leave */
	char errmsg[256];
	int consumed, outstanding;
	int efd, efd_set;
	int watched; /* vconn_fd was asked: efd follows readiness (v_ready) */
	int nonblock, rto, wto;
	struct vc_shm *shm;
	pthread_mutex_t txmu, rxmu; /* the rings' single producer and consumer */
	/* Mapped regions: copies hold rgmu shared, unexport and close hold it
	 * exclusively to unmap, so no copy touches unmapped memory. */
	pthread_rwlock_t rgmu;
	struct vc_region *regions; /* guarded by rgmu */
};

struct sockq {
	struct sockq *next;
	int fd;
};

struct vconn_listener {
	vconn_client *c;
	vconn_listener *next;
	uint32_t h;
	char addr[256];
	vconn *qhead, *qtail;
	int bridged;                /* FlagBridge: Accepts carry sockets */
	struct sockq *shead, *stail; /* their sockets, not yet taken */
	int err, closed;
	int users; /* vconn_accept calls inside: close waits for them */
	int efd, efd_set;
	int nonblock, timeout;
};

/* Deadlines on CLOCK_MONOTONIC. */
static int deadline(int ms, struct timespec *ts)
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

static int remaining_ms(const struct timespec *ts)
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

/* notify wakes the waiters of a change made outside the socket's frames
 * (mu held), the leader too: its poll does not see the condition. */
static void notify(vconn_client *c)
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
	int ms = dl ? remaining_ms(dl) : -1;
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

/* cv_wait waits (mu held) for what the socket or another thread brings,
 * until the deadline: -ETIMEDOUT. The first waiter reads the socket
 * itself (lead); the others sleep on c->cv. Programs that asked for
 * descriptors or non-blocking mode (c->async) leave the socket to the
 * background reader, which then reads at once. */
static int cv_wait(vconn_client *c, const struct timespec *dl)
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

/* set_async makes the background reader the socket's only reader (mu
 * held): a program polling descriptors waits outside cv_wait. */
static void set_async(vconn_client *c)
{
	if (!c->async) {
		c->async = 1;
		pthread_cond_signal(&c->bgcv);
		if (c->leader == LEAD_APP)
			kick(c);
	}
}

static void efd_set(int fd, int *set, int ready)
{
	uint64_t one = 1;
	if (ready && !*set) {
		if (write(fd, &one, sizeof one) == sizeof one)
			*set = 1;
	} else if (!ready && *set) {
		if (read(fd, &one, sizeof one) == sizeof one)
			*set = 0;
	}
}

/* v_ready keeps v's descriptor readable exactly while a read would not
 * block (socket vconns; mu held). A socket vconn whose descriptor nobody
 * asked for (vconn_fd) skips it: the eventfd's write and read were two
 * system calls a message. A shared-memory vconn's own waits poll it. */
static void v_ready(vconn *v)
{
	if (!v->watched && !v->shm)
		return;
	efd_set(v->efd, &v->efd_set, v->qhead || v->cur || v->eof || v->err || v->closed);
}

static void l_ready(vconn_listener *l) { efd_set(l->efd, &l->efd_set, l->qhead || l->shead || l->err || l->closed); }

static void free_sockq(struct sockq *q)
{
	while (q) {
		struct sockq *n = q->next;
		close(q->fd);
		free(q);
		q = n;
	}
}

/* enter and leave bracket a call on v, so that vconn_close, which wakes
 * the calls inside, frees v only once they left. */
static int enter(vconn *v)
{
	pthread_mutex_lock(&v->c->mu);
	int closed = v->closed;
	if (!closed)
		v->users++;
	pthread_mutex_unlock(&v->c->mu);
	if (closed)
		vc_seterr("the vconn is closed");
	return closed ? -EBADF : 0;
}

static void leave(vconn *v)
{
	pthread_mutex_lock(&v->c->mu);
	if (--v->users == 0)
		notify(v->c);
	pthread_mutex_unlock(&v->c->mu);
}

static void free_pending(struct pending *p)
{
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

/* fail breaks the session (mu held): every waiter and vconn fails. */
static void fail(vconn_client *c, int err, const char *msg)
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
			p->send_of->outstanding--;
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
	for (vconn *v = c->vconns; v; v = v->next) {
		if (!v->err) {
			v->err = err;
			snprintf(v->errmsg, sizeof v->errmsg, "%s", msg);
		}
		v_ready(v);
	}
	for (vconn_listener *l = c->lns; l; l = l->next) {
		if (!l->err)
			l->err = err;
		l_ready(l);
	}
	notify(c);
}

static int write_frame(vconn_client *c, const struct vconn_frame *f)
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
		fail(c, -ENOTCONN, w < 0 ? strerror(e) : "short write to the agent");
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

/* reply is what call returns: the OK frame, with its payload copied. */
struct reply {
	struct vconn_frame f;
	uint8_t *payload;
	int fds[3], nfds;
};

static void reply_free(struct reply *r)
{
	for (int i = 0; i < r->nfds; i++)
		close(r->fds[i]);
	free(r->payload);
	memset(r, 0, sizeof *r);
}

/* call sends a request and waits for its reply, for at most ms. */
static int call(vconn_client *c, struct vconn_frame *f, int ms, struct reply *out)
{
	struct timespec ts;
	const struct timespec *dl = deadline(ms, &ts) ? &ts : NULL;
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
	int err = write_frame(c, f);
	pthread_mutex_lock(&c->mu);
	while (!err && !p->done)
		err = cv_wait(c, dl);
	if (!p->done && err == -ETIMEDOUT)
		vc_seterr("%s: no reply from the agent in %d ms", vconn_op_name(f->op), ms);
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

static vconn *find_vconn(vconn_client *c, uint32_t h)
{
	for (vconn *v = c->vconns; v; v = v->next)
		if (v->h == h)
			return v;
	return NULL;
}

static vconn_listener *find_listener(vconn_client *c, uint32_t h)
{
	for (vconn_listener *l = c->lns; l; l = l->next)
		if (l->h == h)
			return l;
	return NULL;
}

static vconn *new_vconn(vconn_client *c, uint32_t h, uint64_t info, const uint8_t *remote, uint32_t rlen)
{
	vconn *v = calloc(1, sizeof *v);
	if (!v)
		return NULL;
	v->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (v->efd < 0) {
		free(v);
		return NULL;
	}
	v->c = c;
	v->h = h;
	v->transport = (int)((info >> 32) & 0xff);
	v->max_msg = (uint32_t)info;
	if (v->max_msg == 0 || v->max_msg > c->info.max_message)
		v->max_msg = c->info.max_message;
	if (rlen >= sizeof v->remote)
		rlen = sizeof v->remote - 1;
	memcpy(v->remote, remote, rlen);
	v->remote[rlen] = 0;
	v->rto = v->wto = -1;
	pthread_mutex_init(&v->txmu, NULL);
	pthread_mutex_init(&v->rxmu, NULL);
	pthread_rwlock_init(&v->rgmu, NULL);
	v->next = c->vconns;
	c->vconns = v;
	return v;
}

static void free_msgs(struct msg *m)
{
	while (m) {
		struct msg *n = m->next;
		free(m);
		m = n;
	}
}

static void destroy_vconn(vconn *v)
{
	free_msgs(v->qhead);
	free(v->cur);
	if (v->shm) {
		vc_shm_close(v->shm);
		free(v->shm);
	}
	for (struct vc_region *g = v->regions, *n; g; g = n) {
		n = g->next;
		munmap(g->mem, g->size);
		free(g);
	}
	close(v->efd);
	pthread_mutex_destroy(&v->txmu);
	pthread_mutex_destroy(&v->rxmu);
	pthread_rwlock_destroy(&v->rgmu);
	free(v);
}

/* unlink_vconn takes v out of the client (mu held): no reply or push
 * reaches it any more. */
static void unlink_vconn(vconn_client *c, vconn *v)
{
	for (vconn **pp = &c->vconns; *pp; pp = &(*pp)->next)
		if (*pp == v) {
			*pp = v->next;
			break;
		}
	for (struct pending *p = c->pending; p; p = p->next)
		if (p->send_of == v)
			p->send_of = NULL;
}

/* send_discard sends a request whose reply nobody waits for. */
static void send_discard(vconn_client *c, struct vconn_frame *f)
{
	pthread_mutex_lock(&c->mu);
	struct pending *p = c->err ? NULL : add_pending(c, f);
	if (p)
		p->discard = 1;
	pthread_mutex_unlock(&c->mu);
	if (p)
		write_frame(c, f);
}

/* dispatch handles one frame from the agent (mu held); fds are its
 * descriptors, which it takes. */
static void dispatch(vconn_client *c, const struct vconn_frame *f, int *fds, int nfds)
{
	if (f->req != 0 && (f->op == VC_OP_OK || f->op == VC_OP_ERROR)) {
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
			vconn *v = p->send_of;
			v->outstanding--;
			if (p->err && !v->send_err) {
				v->send_err = p->err;
				snprintf(v->errmsg, sizeof v->errmsg, "%.*s", (int)f->len, (const char *)f->payload);
			}
			p->discard = 1;
		}
		if (p->discard) {
			unlink_pending(c, p);
			free_pending(p);
		}
		return;
	}
	if (f->op == VC_OP_ACCEPT && nfds > 0) {
		/* A bridged listener's vconn, as a socket. */
		vconn_listener *l = find_listener(c, f->handle);
		struct sockq *q = l && l->bridged && !l->closed ? malloc(sizeof *q) : NULL;
		for (int i = q ? 1 : 0; i < nfds; i++)
			close(fds[i]);
		if (!q)
			return; /* closing the socket ends the bridged vconn */
		q->fd = fds[0];
		q->next = NULL;
		if (l->stail)
			l->stail->next = q;
		else
			l->shead = q;
		l->stail = q;
		l_ready(l);
		return;
	}
	for (int i = 0; i < nfds; i++)
		close(fds[i]);
	vconn *v;
	switch (f->op) {
	case VC_OP_DATA: {
		if (!(v = find_vconn(c, f->handle)))
			return;
		struct msg *m = malloc(sizeof *m + f->len);
		if (!m) {
			fail(c, -ENOMEM, "out of memory for a message");
			return;
		}
		m->next = NULL;
		m->len = f->len;
		m->imm = f->arg;
		m->has_imm = f->flags & VC_FLAG_IMM;
		if (f->len)
			memcpy(m->data, f->payload, f->len);
		if (v->qtail)
			v->qtail->next = m;
		else
			v->qhead = m;
		v->qtail = m;
		v_ready(v);
		return;
	}
	case VC_OP_EOF:
		if ((v = find_vconn(c, f->handle))) {
			v->eof = 1;
			v_ready(v);
		}
		return;
	case VC_OP_ERROR:
		if (f->handle == 0) {
			/* req 0, handle 0: the agent's last frame (docs/protocol.md
			 * §3, §8); the session ends here, with the agent's reason,
			 * whether or not its close has come yet. */
			char why[200];
			snprintf(why, sizeof why, "the agent ended the session: %.*s", (int)(f->len < 160 ? f->len : 160),
				 (const char *)f->payload);
			fail(c, vconn_code_errno(f->arg), why);
			return;
		}
		if ((v = find_vconn(c, f->handle)) && !v->err) {
			v->err = vconn_code_errno(f->arg);
			snprintf(v->errmsg, sizeof v->errmsg, "%.*s", (int)f->len, (const char *)f->payload);
			v_ready(v);
		}
		return;
	case VC_OP_ACCEPT: {
		vconn_listener *l = find_listener(c, f->handle);
		if (l && l->bridged) {
			fail(c, -EPROTO, "the agent accepted on a bridged listener without a socket");
			return;
		}
		if (!l || l->closed || !(v = new_vconn(c, f->arg, f->arg2, f->payload, f->len))) {
			/* Nobody takes it: give its quota slot back. */
			struct vconn_frame cl = {.op = VC_OP_CLOSE, .handle = f->arg};
			struct pending *p = add_pending(c, &cl);
			if (p) {
				p->discard = 1;
				/* Written by the reader without mu: see reader(). */
				p->f = cl;
				p->f.op = VC_OP_CLOSE;
			}
			return;
		}
		if (l->qtail)
			l->qtail->qnext = v;
		else
			l->qhead = v;
		l->qtail = v;
		l_ready(l);
		return;
	}
	case VC_OP_OK:
		return; /* a reply to a request sent with req 0: none are */
	}
	char why[64];
	snprintf(why, sizeof why, "the agent sent a %s frame", vconn_op_name(f->op));
	fail(c, -EPROTO, why);
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
		fail(c, n <= 0 ? -ENOTCONN : -EPROTO, msg);
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
		write_frame(c, &cl);
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
	deadline(ms, &ts);
	pthread_cond_timedwait(&c->bgcv, &c->mu, &ts);
}

/* reader is the background reader: the socket's reader while no thread of
 * the program waits in cv_wait, and always once c->async. */
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

void vconn_client_close(vconn_client *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&c->mu);
	c->closing = 1;
	pthread_cond_signal(&c->bgcv);
	pthread_mutex_unlock(&c->mu);
	shutdown(c->fd, SHUT_RDWR);
	if (c->reader_started)
		pthread_join(c->reader, NULL);
	close(c->fd);
	if (c->kick >= 0)
		close(c->kick);
	free(c->rbuf);
	for (struct pending *p = c->pending, *n; p; p = n) {
		n = p->next;
		free_pending(p);
	}
	for (vconn *v = c->vconns, *n; v; v = n) {
		n = v->next;
		destroy_vconn(v);
	}
	for (vconn_listener *l = c->lns, *n; l; l = n) {
		n = l->next;
		free_sockq(l->shead);
		close(l->efd);
		free(l);
	}
	pthread_mutex_destroy(&c->mu);
	pthread_mutex_destroy(&c->wmu);
	pthread_cond_destroy(&c->cv);
	pthread_cond_destroy(&c->bgcv);
	free(c);
}

int vconn_client_open(vconn_client **out, const struct vconn_options *o)
{
	struct vconn_options def = {0};
	if (!o)
		o = &def;
	*out = NULL;
	int fd = vc_agent_connect(o);
	if (fd < 0)
		return fd;
	vconn_client *c = calloc(1, sizeof *c);
	if (!c) {
		close(fd);
		return -ENOMEM;
	}
	c->want_shm = o->shared_memory;
	c->timeout_ms = o->timeout_ms == 0 ? DEFAULT_TIMEOUT_MS : o->timeout_ms;
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
	if (c->kick < 0 || !c->rbuf) {
		vconn_client_close(c);
		return -ENOMEM;
	}
	if (pthread_create(&c->reader, NULL, reader, c) != 0) {
		vconn_client_close(c);
		return -EAGAIN;
	}
	c->reader_started = 1;
	struct vconn_frame f = {.op = VC_OP_HELLO, .arg = VC_VERSION};
	struct reply r = {0};
	int err = call(c, &f, c->timeout_ms, &r);
	if (!err && r.f.arg != VC_VERSION) {
		vc_seterr("hello: the agent speaks version %u, this library %d", r.f.arg, VC_VERSION);
		err = -EPROTONOSUPPORT;
	}
	if (!err && vconn_hello_decode(r.payload, r.f.len, &c->info) != 0) {
		vc_seterr("hello: the agent's hello info is %u bytes, want 12..265", r.f.len);
		err = -EPROTO;
	}
	if (!err)
		c->features = r.f.arg2;
	reply_free(&r);
	if (err) {
		char keep[sizeof errbuf];
		snprintf(keep, sizeof keep, "%s", errbuf);
		vconn_client_close(c);
		vc_seterr("%s", keep);
		return err;
	}
	*out = c;
	return 0;
}

int vconn_client_quota(vconn_client *c) { return (int)c->info.quota; }
int vconn_client_send_window(vconn_client *c) { return (int)c->info.send_window; }
int vconn_client_max_message(vconn_client *c) { return (int)c->info.max_message; }
const char *vconn_client_node(vconn_client *c) { return c->info.node; }

/* start opens a new vconn's receive path: shared memory if the client
 * asked and the agent agrees, else the socket's window. */
static int start(vconn *v)
{
	vconn_client *c = v->c;
	if (c->want_shm) {
		struct vconn_frame f = {.op = VC_OP_SHM, .handle = v->h};
		struct reply r = {0};
		int err = call(c, &f, c->timeout_ms, &r);
		if (!err) {
			struct vconn_shm_layout l;
			struct vc_shm *s = NULL;
			if (r.nfds != 3 || vconn_shm_layout_decode(r.payload, r.f.len, &l) != 0) {
				vc_seterr("shm: the agent's reply has %d descriptors and a %u-byte layout", r.nfds, r.f.len);
				err = -EPROTO;
			} else if (!(s = calloc(1, sizeof *s))) {
				err = -ENOMEM;
			} else {
				err = vc_shm_open(s, &l, r.fds);
				r.nfds = 0; /* taken */
			}
			reply_free(&r);
			if (err) {
				free(s);
				return err; /* the agent reads the engine into the ring: no way back */
			}
			pthread_mutex_lock(&c->mu);
			v->shm = s;
			set_async(c); /* its waits poll the doorbell, not cv_wait */
			v_ready(v); /* its waits poll efd from now on */
			pthread_mutex_unlock(&c->mu);
			return 0;
		}
		if (err == -ENOTCONN || err == -ETIMEDOUT)
			return err;
		/* Refused: the vconn stays on the socket. */
	}
	struct vconn_frame g = {.op = VC_OP_GRANT, .handle = v->h, .arg = RECV_WINDOW};
	return write_frame(c, &g);
}

static void drop_vconn(vconn *v)
{
	vconn_client *c = v->c;
	pthread_mutex_lock(&c->mu);
	unlink_vconn(c, v);
	pthread_mutex_unlock(&c->mu);
	struct vconn_frame f = {.op = VC_OP_CLOSE, .handle = v->h};
	send_discard(c, &f);
	destroy_vconn(v);
}

/* dial_once dials addr as given: a vconn into *out, or, with sock, a
 * bridged vconn's socket into *sock. */
static int dial_once(vconn_client *c, const char *addr, vconn **out, int *sock)
{
	size_t n = strlen(addr);
	if (n > VCONN_MAX_PAYLOAD)
		return -EINVAL;
	struct vconn_frame f = {.op = VC_OP_DIAL, .payload = (const uint8_t *)addr, .len = (uint32_t)n};
	if (sock)
		f.flags = VC_FLAG_BRIDGE;
	struct reply r = {0};
	int err = call(c, &f, c->timeout_ms, &r);
	if (err)
		return err;
	if (sock) {
		if (r.nfds != 1) {
			vc_seterr("dial %s: the agent's bridged reply carried %d descriptors, want 1", addr, r.nfds);
			reply_free(&r);
			return -EPROTO;
		}
		*sock = r.fds[0];
		r.nfds = 0;
		reply_free(&r);
		return 0;
	}
	pthread_mutex_lock(&c->mu);
	vconn *v = c->err ? NULL : new_vconn(c, r.f.handle, r.f.arg2, (const uint8_t *)addr, (uint32_t)n);
	err = v ? 0 : c->err ? c->err : -ENOMEM;
	pthread_mutex_unlock(&c->mu);
	reply_free(&r);
	if (err)
		return err;
	if ((err = start(v)) != 0) {
		drop_vconn(v);
		return err;
	}
	*out = v;
	return 0;
}

/* split_addr parses "host:port" (IPv6 in brackets) into host and port. */
static int split_addr(const char *addr, char *host, size_t hcap, unsigned *port)
{
	const char *colon = strrchr(addr, ':');
	if (!colon)
		return -EINVAL;
	const char *h = addr, *he = colon;
	if (*h == '[') {
		if (he == h || he[-1] != ']')
			return -EINVAL;
		h++;
		he--;
	}
	if ((size_t)(he - h) >= hcap)
		return -EINVAL;
	memcpy(host, h, (size_t)(he - h));
	host[he - h] = 0;
	char *end;
	unsigned long p = strtoul(colon + 1, &end, 10);
	if (!colon[1] || *end || p == 0 || p > 65535)
		return -EINVAL;
	*port = (unsigned)p;
	return 0;
}

static int dial(vconn_client *c, const char *addr, vconn **out, int *sock)
{
	char host[256];
	unsigned port;
	if (split_addr(addr, host, sizeof host, &port) != 0 || !host[0]) {
		vc_seterr("dial %s: want host:port with a port of 1..65535", addr);
		return -EINVAL;
	}
	int err = dial_once(c, addr, out, sock);
	if (err != -ENXIO)
		return err;
	/* A name the agent does not know: resolve it and dial its IPs. */
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
	if (getaddrinfo(host, NULL, &hints, &res) != 0) {
		vc_seterr("dial %s: no node of that name, and it does not resolve", addr);
		return -ENXIO;
	}
	for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
		char ip[INET6_ADDRSTRLEN + 2], a[300];
		if (getnameinfo(ai->ai_addr, ai->ai_addrlen, ip, sizeof ip, NULL, 0, NI_NUMERICHOST) != 0)
			continue;
		snprintf(a, sizeof a, ai->ai_family == AF_INET6 ? "[%s]:%u" : "%s:%u", ip, port);
		if ((err = dial_once(c, a, out, sock)) == 0)
			break;
	}
	freeaddrinfo(res);
	return err;
}

int vconn_dial(vconn_client *c, const char *addr, vconn **out)
{
	*out = NULL;
	return dial(c, addr, out, NULL);
}

int vconn_dial_socket(vconn_client *c, const char *addr, int *fd)
{
	*fd = -1;
	return dial(c, addr, NULL, fd);
}

static int listen_as(vconn_client *c, const char *addr, vconn_listener **out, int bridged)
{
	char host[256];
	unsigned port;
	*out = NULL;
	if (split_addr(addr, host, sizeof host, &port) != 0) {
		vc_seterr("listen %s: want :port with a port of 1..65535", addr);
		return -EINVAL;
	}
	vconn_listener *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	l->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (l->efd < 0) {
		free(l);
		return -EMFILE;
	}
	l->c = c;
	l->timeout = -1;
	l->bridged = bridged;
	struct vconn_frame f = {.op = VC_OP_LISTEN, .arg = port, .flags = bridged ? VC_FLAG_BRIDGE : 0};
	struct reply r = {0};
	int err = call(c, &f, c->timeout_ms, &r);
	if (err) {
		close(l->efd);
		free(l);
		return err;
	}
	l->h = r.f.handle;
	if (r.f.len)
		snprintf(l->addr, sizeof l->addr, "%.*s", (int)r.f.len, (const char *)r.payload);
	else
		snprintf(l->addr, sizeof l->addr, "%s:%u", c->info.node, port);
	reply_free(&r);
	pthread_mutex_lock(&c->mu);
	l->next = c->lns;
	c->lns = l;
	pthread_mutex_unlock(&c->mu);
	/* A host, if given, must be the one the listener got. */
	char bound[256];
	unsigned bp;
	if (host[0] && strcmp(host, "0.0.0.0") && strcmp(host, "::") &&
	    (split_addr(l->addr, bound, sizeof bound, &bp) != 0 || strcmp(bound, host))) {
		char keep[300];
		snprintf(keep, sizeof keep, "listen %s: this allocation listens at %s", addr, l->addr);
		vconn_listener_close(l);
		vc_seterr("%s", keep);
		return -EADDRNOTAVAIL;
	}
	*out = l;
	return 0;
}

int vconn_listen(vconn_client *c, const char *addr, vconn_listener **out) { return listen_as(c, addr, out, 0); }
int vconn_listen_socket(vconn_client *c, const char *addr, vconn_listener **out) { return listen_as(c, addr, out, 1); }

int vconn_accept_socket(vconn_listener *l, int *fd)
{
	vconn_client *c = l->c;
	struct timespec ts;
	const struct timespec *dl = deadline(l->timeout, &ts) ? &ts : NULL;
	*fd = -1;
	if (!l->bridged) {
		vc_seterr("accept: the listener was not made with vconn_listen_socket");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mu);
	if (l->closed) {
		pthread_mutex_unlock(&c->mu);
		return -EBADF;
	}
	l->users++;
	int err = 0;
	for (;;) {
		struct sockq *q = l->shead;
		if (q) {
			l->shead = q->next;
			if (!l->shead)
				l->stail = NULL;
			*fd = q->fd;
			free(q);
			l_ready(l);
			break;
		}
		err = l->closed ? -EBADF : l->err;
		if (!err && l->nonblock)
			err = -EAGAIN;
		if (!err)
			err = cv_wait(c, dl);
		if (err)
			break;
	}
	if (--l->users == 0)
		notify(c);
	pthread_mutex_unlock(&c->mu);
	return err;
}

int vconn_listener_fd(vconn_listener *l)
{
	pthread_mutex_lock(&l->c->mu);
	set_async(l->c);
	pthread_mutex_unlock(&l->c->mu);
	return l->efd;
}
const char *vconn_listener_addr(vconn_listener *l) { return l->addr; }
int vconn_listener_set_nonblock(vconn_listener *l, int on)
{
	l->nonblock = on;
	if (on) {
		pthread_mutex_lock(&l->c->mu);
		set_async(l->c);
		pthread_mutex_unlock(&l->c->mu);
	}
	return 0;
}
int vconn_listener_set_timeout(vconn_listener *l, int ms)
{
	l->timeout = ms;
	return 0;
}

int vconn_accept(vconn_listener *l, vconn **out)
{
	vconn_client *c = l->c;
	struct timespec ts;
	const struct timespec *dl = deadline(l->timeout, &ts) ? &ts : NULL;
	*out = NULL;
	if (l->bridged) {
		vc_seterr("accept: a listener made with vconn_listen_socket accepts with vconn_accept_socket");
		return -EINVAL;
	}
	pthread_mutex_lock(&c->mu);
	if (l->closed) {
		pthread_mutex_unlock(&c->mu);
		return -EBADF;
	}
	l->users++;
	for (;;) {
		vconn *v = l->qhead;
		if (v) {
			l->qhead = v->qnext;
			if (!l->qhead)
				l->qtail = NULL;
			v->qnext = NULL;
			l_ready(l);
			if (--l->users == 0)
				notify(c);
			pthread_mutex_unlock(&c->mu);
			int err = start(v);
			if (err) {
				drop_vconn(v);
				return err;
			}
			*out = v;
			return 0;
		}
		int err = l->closed ? -EBADF : l->err;
		if (!err && l->nonblock)
			err = -EAGAIN;
		if (!err)
			err = cv_wait(c, dl);
		if (err) {
			if (err == l->err)
				vc_seterr("accept: %s", c->errmsg);
			if (--l->users == 0)
				notify(c);
			pthread_mutex_unlock(&c->mu);
			return err;
		}
	}
}

int vconn_listener_shutdown(vconn_listener *l)
{
	vconn_client *c = l->c;
	pthread_mutex_lock(&c->mu);
	if (l->closed) {
		pthread_mutex_unlock(&c->mu);
		return 0;
	}
	l->closed = 1;
	vconn *q = l->qhead;
	l->qhead = l->qtail = NULL;
	struct sockq *sq = l->shead;
	l->shead = l->stail = NULL;
	l_ready(l);
	notify(c);
	while (l->users > 0) /* accepts inside return -EBADF */
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	free_sockq(sq);
	while (q) {
		vconn *n = q->qnext;
		drop_vconn(q);
		q = n;
	}
	struct vconn_frame f = {.op = VC_OP_CLOSE, .handle = l->h};
	int err = call(c, &f, c->timeout_ms, NULL);
	return err == -ENOTCONN || err == -EBADF ? 0 : err;
}

int vconn_listener_close(vconn_listener *l)
{
	vconn_client *c = l->c;
	int err = vconn_listener_shutdown(l);
	pthread_mutex_lock(&c->mu);
	for (vconn_listener **pp = &c->lns; *pp; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	pthread_mutex_unlock(&c->mu);
	close(l->efd);
	free(l);
	return err;
}

/* acquire takes a slot of the send window (mu held); nonblock: fail
 * with -EAGAIN rather than wait. */
static int acquire(vconn *v, int ms, int nonblock)
{
	vconn_client *c = v->c;
	struct timespec ts;
	const struct timespec *dl = deadline(ms, &ts) ? &ts : NULL;
	for (;;) {
		if (v->closed)
			return -EBADF;
		if (v->err)
			return v->err;
		if (c->err)
			return c->err;
		if (v->outstanding < (int)c->info.send_window)
			break;
		if (nonblock)
			return -EAGAIN;
		int err = cv_wait(c, dl);
		if (err)
			return err;
	}
	v->outstanding++;
	return 0;
}

static int fail_with(vconn *v, int err)
{
	if (err == v->err || err == v->send_err)
		vc_seterr("%s", v->errmsg);
	return err;
}

static int shm_send(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm);

static int send_msg_in(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm);

static int send_msg(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm)
{
	int err = enter(v);
	if (err)
		return err;
	err = send_msg_in(v, b, n, imm, has_imm);
	leave(v);
	return err;
}

static int send_msg_in(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm)
{
	vconn_client *c = v->c;
	if (n > v->max_msg) {
		vc_seterr("message of %zu bytes, at most %u on this vconn", n, v->max_msg);
		return -EMSGSIZE;
	}
	if (v->shm)
		return shm_send(v, b, n, imm, has_imm);
	pthread_mutex_lock(&c->mu);
	int err = v->send_err;
	if (!err)
		err = acquire(v, v->wto, v->nonblock);
	if (err) {
		err = fail_with(v, err);
		pthread_mutex_unlock(&c->mu);
		return err;
	}
	struct vconn_frame f = {.op = VC_OP_SEND, .handle = v->h, .payload = b, .len = (uint32_t)n};
	if (has_imm) {
		f.flags = VC_FLAG_IMM;
		f.arg = imm;
	}
	struct pending *p = add_pending(c, &f);
	if (!p) {
		v->outstanding--;
		pthread_mutex_unlock(&c->mu);
		return -ENOMEM;
	}
	p->send_of = v;
	p->discard = 1;
	pthread_mutex_unlock(&c->mu);
	return write_frame(c, &f); /* on failure, fail() settled p */
}

int vconn_send(vconn *v, const void *buf, size_t n) { return send_msg(v, buf, n, 0, 0); }
int vconn_send_imm(vconn *v, const void *buf, size_t n, uint32_t imm) { return send_msg(v, buf, n, imm, 1); }

static int shm_next(vconn *v, size_t cap, struct msg **out, int ms);

/* next_msg takes the next message whole (rxmu held, mu not): -EMSGSIZE,
 * keeping it, when it is longer than cap; -ENODATA at EOF. */
static int next_msg(vconn *v, size_t cap, struct msg **out)
{
	vconn_client *c = v->c;
	if (v->shm)
		return shm_next(v, cap, out, v->rto);
	struct timespec ts;
	const struct timespec *dl = deadline(v->rto, &ts) ? &ts : NULL;
	pthread_mutex_lock(&c->mu);
	for (;;) {
		struct msg *m = v->qhead;
		int err = 0;
		if (v->closed) {
			err = -EBADF;
		} else if (m) {
			if (m->len > cap) {
				pthread_mutex_unlock(&c->mu);
				vc_seterr("a message of %u bytes does not fit %zu", m->len, cap);
				return -EMSGSIZE;
			}
			v->qhead = m->next;
			if (!v->qhead)
				v->qtail = NULL;
			int grant = 0;
			if (++v->consumed >= RECV_WINDOW / 2) {
				grant = v->consumed;
				v->consumed = 0;
			}
			v_ready(v);
			pthread_mutex_unlock(&c->mu);
			if (grant) {
				struct vconn_frame g = {.op = VC_OP_GRANT, .handle = v->h, .arg = (uint32_t)grant};
				write_frame(c, &g);
			}
			*out = m;
			return 0;
		} else if (v->eof) {
			err = -ENODATA;
		} else if (v->err) {
			err = fail_with(v, v->err);
		} else if (v->nonblock) {
			err = -EAGAIN;
		} else {
			err = cv_wait(c, dl);
		}
		if (err) {
			pthread_mutex_unlock(&c->mu);
			return err;
		}
	}
}

ssize_t vconn_recv(vconn *v, void *buf, size_t cap, uint32_t *imm, int *has_imm)
{
	struct msg *m;
	int err = enter(v);
	if (err)
		return err;
	pthread_mutex_lock(&v->rxmu);
	err = next_msg(v, cap, &m);
	pthread_mutex_unlock(&v->rxmu);
	leave(v);
	if (err)
		return err;
	if (m->len)
		memcpy(buf, m->data, m->len);
	if (imm)
		*imm = m->imm;
	if (has_imm)
		*has_imm = m->has_imm;
	ssize_t n = m->len;
	free(m);
	return n;
}

static int reliable(int t) { return t == VCONN_TRANSPORT_UNKNOWN || t == VCONN_TRANSPORT_RC || t == VCONN_TRANSPORT_AUTO; }
int vconn_is_stream(vconn *v) { return reliable(v->transport); }

ssize_t vconn_read(vconn *v, void *buf, size_t n)
{
	if (!reliable(v->transport)) {
		vc_seterr("read: a %d vconn may lose messages: use vconn_recv", v->transport);
		return -EPROTOTYPE;
	}
	if (n == 0)
		return 0;
	int err = enter(v);
	if (err)
		return err;
	pthread_mutex_lock(&v->rxmu);
	while (!v->cur) {
		err = next_msg(v, (size_t)-1, &v->cur);
		if (err) {
			pthread_mutex_unlock(&v->rxmu);
			leave(v);
			return err == -ENODATA ? 0 : err;
		}
		v->curoff = 0;
		if (v->cur->len == 0) {
			free(v->cur);
			v->cur = NULL;
		}
	}
	size_t k = v->cur->len - v->curoff;
	if (k > n)
		k = n;
	memcpy(buf, v->cur->data + v->curoff, k);
	v->curoff += k;
	if (v->curoff == v->cur->len) {
		free(v->cur);
		v->cur = NULL;
	}
	pthread_mutex_unlock(&v->rxmu);
	leave(v);
	return (ssize_t)k;
}

ssize_t vconn_write(vconn *v, const void *buf, size_t n)
{
	if (!reliable(v->transport)) {
		vc_seterr("write: a %d vconn may lose messages: use vconn_send", v->transport);
		return -EPROTOTYPE;
	}
	size_t done = 0;
	while (done < n) {
		size_t k = n - done < v->max_msg ? n - done : v->max_msg;
		int err = send_msg(v, (const uint8_t *)buf + done, k, 0, 0);
		if (err)
			return done ? (ssize_t)done : err;
		done += k;
	}
	return (ssize_t)done;
}

/* op runs one vconn operation in the vconn's order and waits for it. */
static int op(vconn *v, struct vconn_frame *f, struct reply *r)
{
	vconn_client *c = v->c;
	int err = enter(v);
	if (err)
		return err;
	pthread_mutex_lock(&c->mu);
	/* One-sided operations block: their reply is the result. */
	err = acquire(v, c->timeout_ms, 0);
	if (err)
		err = fail_with(v, err);
	pthread_mutex_unlock(&c->mu);
	if (!err) {
		f->handle = v->h;
		err = call(c, f, c->timeout_ms, r);
		pthread_mutex_lock(&c->mu);
		v->outstanding--;
		notify(c);
		pthread_mutex_unlock(&c->mu);
	}
	leave(v);
	return err;
}

/* map_region maps the memfd the agent passed with an Export's OK as
 * region id; where it does not map, the region stays on the socket. */
static void map_region(vconn *v, uint32_t id, int fd, size_t size)
{
	struct vc_region *g = malloc(sizeof *g);
	if (!g || vc_memfd_map(fd, size, &g->mem) != 0) {
		free(g);
		return;
	}
	g->id = id;
	g->size = size;
	pthread_rwlock_wrlock(&v->rgmu);
	g->next = v->regions;
	v->regions = g;
	pthread_rwlock_unlock(&v->rgmu);
}

int vconn_export(vconn *v, size_t size, int access, uint32_t *region)
{
	if ((access & ~3) || !access) {
		vc_seterr("export: access %#x: want VCONN_ACCESS_READ, VCONN_ACCESS_WRITE or both", access);
		return -EINVAL;
	}
	struct vconn_frame f = {.op = VC_OP_EXPORT, .arg = (uint32_t)access, .arg2 = size};
	/* In memory this process maps, where the agent offers it: region
	 * reads and writes are then copies here, not frames. */
	int memfd = (v->c->features & VC_FEATURE_MEMFD) && size > 0;
	if (memfd)
		f.flags = VC_FLAG_MEMFD;
	int err = enter(v); /* v stays until the mapping is recorded */
	if (err)
		return err;
	struct reply r = {0};
	err = op(v, &f, &r);
	if (!err) {
		*region = r.f.arg;
		if (memfd && r.nfds == 1)
			map_region(v, r.f.arg, r.fds[0], size);
	}
	reply_free(&r);
	leave(v);
	return err;
}

int vconn_unexport(vconn *v, uint32_t region)
{
	int err = enter(v);
	if (err)
		return err;
	pthread_rwlock_wrlock(&v->rgmu);
	struct vc_region *g = NULL;
	for (struct vc_region **pp = &v->regions; *pp; pp = &(*pp)->next)
		if ((*pp)->id == region) {
			g = *pp;
			*pp = g->next;
			break;
		}
	pthread_rwlock_unlock(&v->rgmu);
	if (g) {
		munmap(g->mem, g->size);
		free(g);
	}
	struct vconn_frame f = {.op = VC_OP_UNEXPORT, .arg = region};
	err = op(v, &f, NULL);
	leave(v);
	return err;
}

/* region_copy copies n bytes of a mapped region at off into dst, or src
 * into it: 0, -EACCES out of its bounds, -EBADF on a closed vconn, or 1
 * when the region is not mapped here (the socket's, then). */
static int region_copy(vconn *v, uint32_t region, uint64_t off, void *dst, const void *src, size_t n)
{
	int err = enter(v);
	if (err)
		return err;
	pthread_rwlock_rdlock(&v->rgmu);
	struct vc_region *g = v->regions;
	while (g && g->id != region)
		g = g->next;
	if (!g) {
		err = 1;
	} else if (off > g->size || n > g->size - off) {
		vc_seterr("region %u: %zu bytes at %llu outside its %zu", region, n, (unsigned long long)off, g->size);
		err = -EACCES;
	} else if (src) {
		memcpy(g->mem + off, src, n);
	} else {
		memcpy(dst, g->mem + off, n);
	}
	pthread_rwlock_unlock(&v->rgmu);
	leave(v);
	return err;
}

static int copy_in(vconn *v, uint8_t opc, uint32_t region, uint64_t off, void *buf, size_t n)
{
	for (size_t done = 0; done < n;) {
		size_t k = n - done < VCONN_MAX_PAYLOAD ? n - done : VCONN_MAX_PAYLOAD;
		uint8_t len[4];
		vc_put32(len, (uint32_t)k);
		struct vconn_frame f = {.op = opc, .arg = region, .arg2 = off + done, .payload = len, .len = 4};
		struct reply r = {0};
		int err = op(v, &f, &r);
		if (!err && r.f.len != k) {
			vc_seterr("%s: the agent returned %u bytes of %zu", vconn_op_name(opc), r.f.len, k);
			err = -EPROTO;
		}
		if (!err)
			memcpy((uint8_t *)buf + done, r.payload, k);
		reply_free(&r);
		if (err)
			return err;
		done += k;
	}
	return 0;
}

static int copy_out(vconn *v, uint8_t opc, uint32_t region, uint64_t off, const void *buf, size_t n)
{
	for (size_t done = 0; done < n;) {
		size_t k = n - done < VCONN_MAX_PAYLOAD ? n - done : VCONN_MAX_PAYLOAD;
		struct vconn_frame f = {.op = opc, .arg = region, .arg2 = off + done, .payload = (const uint8_t *)buf + done, .len = (uint32_t)k};
		int err = op(v, &f, NULL);
		if (err)
			return err;
		done += k;
	}
	return 0;
}

int vconn_region_read(vconn *v, uint32_t region, uint64_t off, void *buf, size_t n)
{
	int rc = region_copy(v, region, off, buf, NULL, n);
	return rc == 1 ? copy_in(v, VC_OP_LOCAL_READ, region, off, buf, n) : rc;
}

int vconn_region_write(vconn *v, uint32_t region, uint64_t off, const void *buf, size_t n)
{
	int rc = region_copy(v, region, off, NULL, buf, n);
	return rc == 1 ? copy_out(v, VC_OP_LOCAL_WRITE, region, off, buf, n) : rc;
}
int vconn_read_remote(vconn *v, uint32_t region, uint64_t off, void *buf, size_t n) { return copy_in(v, VC_OP_READ, region, off, buf, n); }
int vconn_write_remote(vconn *v, uint32_t region, uint64_t off, const void *buf, size_t n) { return copy_out(v, VC_OP_WRITE, region, off, buf, n); }

int vconn_set_timeouts(vconn *v, int read_ms, int write_ms)
{
	pthread_mutex_lock(&v->c->mu);
	v->rto = read_ms;
	v->wto = write_ms;
	pthread_mutex_unlock(&v->c->mu);
	return 0;
}

int vconn_set_nonblock(vconn *v, int on)
{
	pthread_mutex_lock(&v->c->mu);
	v->nonblock = on;
	if (on)
		set_async(v->c);
	pthread_mutex_unlock(&v->c->mu);
	return 0;
}

int vconn_fd(vconn *v)
{
	if (v->shm)
		return v->shm->rxbell;
	pthread_mutex_lock(&v->c->mu);
	if (!v->watched) {
		v->watched = 1;
		set_async(v->c);
		v_ready(v); /* readable now if a read would not block */
	}
	pthread_mutex_unlock(&v->c->mu);
	return v->efd;
}
int vconn_max_message(vconn *v) { return (int)v->max_msg; }
int vconn_transport(vconn *v) { return v->transport; }
int vconn_is_shm(vconn *v) { return v->shm != NULL; }
const char *vconn_remote_addr(vconn *v) { return v->remote; }
uint32_t vconn_handle(vconn *v) { return v->h; }

static int wait_in(vconn *v, int events, int ms);

int vconn_wait(vconn *v, int events, int ms)
{
	int err = enter(v);
	if (err)
		return err;
	err = wait_in(v, events, ms);
	leave(v);
	return err;
}

static int wait_in(vconn *v, int events, int ms)
{
	vconn_client *c = v->c;
	if (v->shm) {
		/* Readable: look at the ring, arm, sleep on its doorbell. */
		struct pollfd p[2] = {{.fd = v->shm->rxbell, .events = POLLIN}, {.fd = v->efd, .events = POLLIN}};
		if (!(events & VCONN_POLLIN))
			return events & VCONN_POLLOUT;
		pthread_mutex_lock(&v->rxmu);
		int ready = vc_shm_cons_arm(&v->shm->rx);
		pthread_mutex_unlock(&v->rxmu);
		if (ready)
			return VCONN_POLLIN;
		int n = poll(p, 2, ms); /* efd: a close or a failure the socket reported */
		vc_bell_drain(v->shm->rxbell);
		return n > 0 ? VCONN_POLLIN : n < 0 ? -errno : 0;
	}
	struct timespec ts;
	const struct timespec *dl = deadline(ms, &ts) ? &ts : NULL;
	pthread_mutex_lock(&c->mu);
	int got;
	for (;;) {
		got = 0;
		if (v->closed) {
			got = -EBADF;
			break;
		}
		if ((events & VCONN_POLLIN) && (v->qhead || v->cur || v->eof || v->err || c->err))
			got |= VCONN_POLLIN;
		if ((events & VCONN_POLLOUT) && (v->outstanding < (int)c->info.send_window || v->err || c->err))
			got |= VCONN_POLLOUT;
		if (got || cv_wait(c, dl))
			break;
	}
	pthread_mutex_unlock(&c->mu);
	return got;
}

int vconn_close(vconn *v)
{
	if (!v)
		return 0;
	vconn_client *c = v->c;
	struct timespec ts;
	deadline(CLOSE_DRAIN_MS, &ts);
	/* What was sent is handed over first: the agent drops operations
	 * still queued at Close (docs/protocol.md §3, Close). */
	if (v->shm) {
		/* Without txmu: a sender asleep on a full ring holds it. */
		while (!vc_shm_prod_empty(&v->shm->tx) && remaining_ms(&ts) > 0) {
			pthread_mutex_lock(&c->mu);
			int dead = v->err || c->err;
			pthread_mutex_unlock(&c->mu);
			if (dead)
				break;
			struct timespec nap = {0, 50000};
			nanosleep(&nap, NULL);
		}
	}
	pthread_mutex_lock(&c->mu);
	while (v->outstanding > 0 && !c->err && cv_wait(c, &ts) == 0)
		;
	v->closed = 1;
	v_ready(v); /* wakes a call asleep on a doorbell, which also polls efd */
	notify(c);
	while (v->users > 0) /* the calls inside return -EBADF */
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	struct vconn_frame f = {.op = VC_OP_CLOSE, .handle = v->h};
	int err = call(c, &f, c->timeout_ms, NULL);
	pthread_mutex_lock(&c->mu);
	unlink_vconn(c, v);
	pthread_mutex_unlock(&c->mu);
	destroy_vconn(v);
	return err == -ENOTCONN || err == -EBADF ? 0 : err;
}

/* Shared memory: the client produces ring TX and consumes ring RX. A
 * sleeper also watches the vconn's socket-side descriptor, so that a
 * failure the socket reports ends its wait. */

static int v_dead(vconn *v)
{
	pthread_mutex_lock(&v->c->mu);
	int err = v->closed ? -EBADF : v->err ? v->err : v->c->err;
	if (err)
		fail_with(v, err);
	pthread_mutex_unlock(&v->c->mu);
	return err;
}

static int bell_sleep(vconn *v, int bell, const struct timespec *dl)
{
	struct pollfd p[2] = {{.fd = bell, .events = POLLIN}, {.fd = v->efd, .events = POLLIN}};
	int ms = dl ? remaining_ms(dl) : -1;
	if (dl && ms == 0)
		return -ETIMEDOUT;
	int n = poll(p, 2, ms);
	if (n < 0 && errno != EINTR)
		return -errno;
	if (n > 0 && (p[0].revents & POLLIN) && vc_bell_drain(bell) == -ENOTCONN) {
		/* The agent dropped the segment: the vconn is over. Its reason
		 * may yet come on the socket; until then, this is it. */
		int err = v_dead(v);
		if (!err) {
			pthread_mutex_lock(&v->c->mu);
			if (!v->err) {
				v->err = -ECONNRESET;
				snprintf(v->errmsg, sizeof v->errmsg, "the agent dropped the vconn's shared memory");
			}
			err = fail_with(v, v->err);
			v_ready(v);
			pthread_mutex_unlock(&v->c->mu);
		}
		return err;
	}
	return 0;
}

static int shm_send(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm)
{
	struct timespec ts;
	const struct timespec *dl = deadline(v->wto, &ts) ? &ts : NULL;
	pthread_mutex_lock(&v->txmu);
	int err;
	for (;;) {
		if ((err = v_dead(v)) != 0)
			break;
		err = vc_shm_push(&v->shm->tx, b, (uint32_t)n, imm, has_imm ? VC_DESC_IMM : 0);
		if (err == 1) {
			err = 0;
			break;
		}
		if (err < 0)
			break;
		if (v->nonblock) {
			vc_shm_prod_arm(&v->shm->tx);
			err = -EAGAIN;
			break;
		}
		vc_shm_prod_arm(&v->shm->tx);
		if ((err = vc_shm_push(&v->shm->tx, b, (uint32_t)n, imm, has_imm ? VC_DESC_IMM : 0)) != 0) {
			if (err == 1)
				err = 0;
			break;
		}
		if ((err = bell_sleep(v, v->shm->txbell, dl)) != 0)
			break;
	}
	pthread_mutex_unlock(&v->txmu);
	return err;
}

static int shm_next(vconn *v, size_t cap, struct msg **out, int ms)
{
	struct timespec ts;
	const struct timespec *dl = deadline(ms, &ts) ? &ts : NULL;
	struct vc_consumer *rx = &v->shm->rx;
	int err;
	for (;;) { /* rxmu held: the ring has one consumer */
		struct vc_desc d;
		const uint8_t *p;
		err = vc_shm_peek(rx, &d, &p);
		if (err < 0) {
			pthread_mutex_lock(&v->c->mu);
			if (!v->err) {
				v->err = -EPROTO;
				snprintf(v->errmsg, sizeof v->errmsg, "%.200s", errbuf);
			}
			pthread_mutex_unlock(&v->c->mu);
			break;
		}
		if (err == 1) {
			if (d.flags & VC_DESC_EOF) {
				vc_shm_release(rx);
				pthread_mutex_lock(&v->c->mu);
				v->eof = 1;
				pthread_mutex_unlock(&v->c->mu);
				err = -ENODATA;
				break;
			}
			if (d.flags & VC_DESC_ERROR) {
				pthread_mutex_lock(&v->c->mu);
				if (!v->err) {
					v->err = vconn_code_errno(d.imm);
					snprintf(v->errmsg, sizeof v->errmsg, "%.*s", (int)d.len, (const char *)p);
				}
				err = fail_with(v, v->err);
				pthread_mutex_unlock(&v->c->mu);
				vc_shm_release(rx);
				break;
			}
			if (d.len > cap) {
				vc_seterr("a message of %u bytes does not fit %zu", d.len, cap);
				err = -EMSGSIZE;
				break;
			}
			struct msg *m = malloc(sizeof *m + d.len);
			if (!m) {
				err = -ENOMEM;
				break;
			}
			m->next = NULL;
			m->len = d.len;
			m->imm = d.imm;
			m->has_imm = d.flags & VC_DESC_IMM;
			memcpy(m->data, p, d.len); /* copied before use: the agent could rewrite it */
			vc_shm_release(rx);
			*out = m;
			err = 0;
			break;
		}
		pthread_mutex_lock(&v->c->mu);
		err = v->eof ? -ENODATA : 0;
		pthread_mutex_unlock(&v->c->mu);
		if (err || (err = v_dead(v)) != 0)
			break;
		if (vc_shm_cons_arm(rx))
			continue;
		if (v->nonblock) {
			err = -EAGAIN;
			break;
		}
		if ((err = bell_sleep(v, v->shm->rxbell, dl)) != 0)
			break;
	}
	return err;
}
