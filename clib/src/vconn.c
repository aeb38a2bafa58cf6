/* Vconns (docs/protocol.md §3): a vconn's life, from the reply or Accept
 * that makes it to its close, its descriptor and its waits. Its messages
 * are io.c's, its regions region.c's. A vconn's state is guarded by its
 * client's mutex (c->mu), but for its rings (txmu, rxmu) and its mapped
 * regions (rgmu). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define CLOSE_DRAIN_MS 5000

vconn *vc_find_vconn(vconn_client *c, uint32_t h)
{
	for (vconn *v = c->vconns; v; v = v->next)
		if (v->h == h)
			return v;
	return NULL;
}

vconn *vc_new_vconn(vconn_client *c, uint32_t h, uint64_t info, const uint8_t *remote, uint32_t rlen)
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

void vc_destroy_vconn(vconn *v)
{
	free_msgs(v->qhead);
	free(v->cur);
	free(v->spare);
	if (v->shm) {
		vc_shm_close(v->shm);
		free(v->shm);
	}
	if (v->stage)
		vc_stage_close(v->stage);
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
	vc_session_forget(c, v);
}

void vc_efd_set(int fd, int *set, int ready)
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

/* vc_v_ready keeps v's descriptor readable exactly while a read would not
 * block (socket vconns; mu held). A socket vconn whose descriptor nobody
 * asked for (vconn_fd) skips it: the eventfd's write and read were two
 * system calls a message. A shared-memory vconn's own waits poll it. */
void vc_v_ready(vconn *v)
{
	if (!v->watched && !v->shm)
		return;
	vc_efd_set(v->efd, &v->efd_set, v->qhead || v->cur || v->eof || v->err || v->closed);
}

/* vc_enter and vc_leave bracket a call on v, so that vconn_close, which
 * wakes the calls inside, frees v only once they left. */
int vc_enter(vconn *v)
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

void vc_leave(vconn *v)
{
	pthread_mutex_lock(&v->c->mu);
	if (--v->users == 0)
		vc_notify(v->c);
	pthread_mutex_unlock(&v->c->mu);
}

int vc_fail_with(vconn *v, int err)
{
	if (err == v->err || err == v->send_err)
		vc_seterr("%s", v->errmsg);
	return err;
}

int vc_v_dead(vconn *v)
{
	pthread_mutex_lock(&v->c->mu);
	int err = v->closed ? -EBADF : v->err ? v->err : v->c->err;
	if (err)
		vc_fail_with(v, err);
	pthread_mutex_unlock(&v->c->mu);
	return err;
}

/* vc_acquire takes a slot of the send window (mu held); nonblock: fail
 * with -EAGAIN rather than wait. */
int vc_acquire(vconn *v, int ms, int nonblock)
{
	vconn_client *c = v->c;
	struct timespec ts;
	const struct timespec *dl = vc_deadline(ms, &ts) ? &ts : NULL;
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
		int err = vc_cv_wait(c, dl);
		if (err)
			return err;
	}
	v->outstanding++;
	return 0;
}

/* start opens a new vconn's receive path: shared memory if the client
 * asked and the agent agrees, else the socket's window. */
static int start(vconn *v)
{
	vconn_client *c = v->c;
	if (c->want_shm) {
		struct vconn_frame f = {.op = VC_OP_SHM, .handle = v->h};
		struct vc_reply r = {0};
		int err = vc_call(c, &f, c->timeout_ms, &r);
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
			vc_reply_free(&r);
			if (err) {
				free(s);
				return err; /* the agent reads the engine into the ring: no way back */
			}
			pthread_mutex_lock(&c->mu);
			v->shm = s;
			vc_set_async(c); /* its waits poll the doorbell, not cv_wait */
			vc_v_ready(v); /* its waits poll efd from now on */
			pthread_mutex_unlock(&c->mu);
			return 0;
		}
		if (err == -ENOTCONN || err == -ETIMEDOUT)
			return err;
		/* Refused: the vconn stays on the socket. */
	}
	struct vconn_frame g = {.op = VC_OP_GRANT, .handle = v->h, .arg = VC_RECV_WINDOW};
	return vc_write_frame(c, &g);
}

void vc_drop_vconn(vconn *v)
{
	vconn_client *c = v->c;
	pthread_mutex_lock(&c->mu);
	unlink_vconn(c, v);
	pthread_mutex_unlock(&c->mu);
	struct vconn_frame f = {.op = VC_OP_CLOSE, .handle = v->h};
	vc_send_discard(c, &f);
	vc_destroy_vconn(v);
}

int vc_hand_over(vconn *v, vconn **out)
{
	int err = start(v);
	if (err) {
		vc_drop_vconn(v);
		return err;
	}
	*out = v;
	return 0;
}

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
		vc_set_async(v->c);
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
		vc_set_async(v->c);
		vc_v_ready(v); /* readable now if a read would not block */
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
	int err = vc_enter(v);
	if (err)
		return err;
	err = wait_in(v, events, ms);
	vc_leave(v);
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
		/* The rest of a message a read took part of is readable too. */
		int ready = v->cur || vc_shm_cons_arm(&v->shm->rx);
		pthread_mutex_unlock(&v->rxmu);
		if (ready)
			return VCONN_POLLIN;
		int n = poll(p, 2, ms); /* efd: a close or a failure the socket reported */
		vc_bell_drain(v->shm->rxbell);
		return n > 0 ? VCONN_POLLIN : n < 0 ? -errno : 0;
	}
	struct timespec ts;
	const struct timespec *dl = vc_deadline(ms, &ts) ? &ts : NULL;
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
		if (got || vc_cv_wait(c, dl))
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
	vc_deadline(CLOSE_DRAIN_MS, &ts);
	/* What was sent is handed over first: the agent drops operations
	 * still queued at Close (docs/protocol.md §3, Close). */
	if (v->shm) {
		/* Without txmu: a sender asleep on a full ring holds it. */
		while (!vc_shm_prod_empty(&v->shm->tx) && vc_remaining_ms(&ts) > 0) {
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
	while (v->outstanding > 0 && !c->err && vc_cv_wait(c, &ts) == 0)
		;
	v->closed = 1;
	vc_v_ready(v); /* wakes a call asleep on a doorbell, which also polls efd */
	vc_notify(c);
	while (v->users > 0) /* the calls inside return -EBADF */
		pthread_cond_wait(&c->cv, &c->mu);
	pthread_mutex_unlock(&c->mu);
	struct vconn_frame f = {.op = VC_OP_CLOSE, .handle = v->h};
	int err = vc_call(c, &f, c->timeout_ms, NULL);
	pthread_mutex_lock(&c->mu);
	unlink_vconn(c, v);
	pthread_mutex_unlock(&c->mu);
	vc_destroy_vconn(v);
	return err == -ENOTCONN || err == -EBADF ? 0 : err;
}

