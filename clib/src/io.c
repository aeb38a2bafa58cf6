/* A vconn's messages (docs/protocol.md §3, Send, Grant, Data): vconn_send
 * and vconn_recv, and the byte stream over them, vconn_read and
 * vconn_write. On the socket, sends take the send window's slots and
 * reads grant the receive window back; on shared memory they are the
 * rings' (shm_io.c). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static int send_msg_in(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm);

static int send_msg(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm)
{
	int err = vc_enter(v);
	if (err)
		return err;
	err = send_msg_in(v, b, n, imm, has_imm);
	vc_leave(v);
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
		return vc_shm_send(v, b, n, imm, has_imm);
	pthread_mutex_lock(&c->mu);
	int err = v->send_err;
	if (!err)
		err = vc_acquire(v, v->wto, v->nonblock);
	if (err) {
		err = vc_fail_with(v, err);
		pthread_mutex_unlock(&c->mu);
		return err;
	}
	struct vconn_frame f = {.op = VC_OP_SEND, .handle = v->h, .payload = b, .len = (uint32_t)n};
	if (has_imm) {
		f.flags = VC_FLAG_IMM;
		f.arg = imm;
	}
	if (vc_add_send(c, &f, v) != 0) {
		v->outstanding--;
		pthread_mutex_unlock(&c->mu);
		return -ENOMEM;
	}
	pthread_mutex_unlock(&c->mu);
	return vc_write_frame(c, &f); /* on failure, vc_fail() settled it */
}

int vconn_send(vconn *v, const void *buf, size_t n) { return send_msg(v, buf, n, 0, 0); }
int vconn_send_imm(vconn *v, const void *buf, size_t n, uint32_t imm) { return send_msg(v, buf, n, imm, 1); }

/* next_msg takes the socket's next message whole (rxmu held, mu not):
 * -EMSGSIZE, keeping it, when it is longer than cap; -ENODATA at EOF.
 * Shared memory's are vc_shm_next's, copied out of the ring once. */
static int next_msg(vconn *v, size_t cap, struct msg **out)
{
	vconn_client *c = v->c;
	struct timespec ts;
	const struct timespec *dl = vc_deadline(v->rto, &ts) ? &ts : NULL;
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
			if (++v->consumed >= VC_RECV_WINDOW / 2) {
				grant = v->consumed;
				v->consumed = 0;
			}
			vc_v_ready(v);
			pthread_mutex_unlock(&c->mu);
			if (grant) {
				struct vconn_frame g = {.op = VC_OP_GRANT, .handle = v->h, .arg = (uint32_t)grant};
				vc_write_frame(c, &g);
			}
			*out = m;
			return 0;
		} else if (v->eof) {
			err = -ENODATA;
		} else if (v->err) {
			err = vc_fail_with(v, v->err);
		} else if (v->nonblock) {
			err = -EAGAIN;
		} else {
			err = vc_cv_wait(c, dl);
		}
		if (err) {
			pthread_mutex_unlock(&c->mu);
			return err;
		}
	}
}

ssize_t vconn_recv(vconn *v, void *buf, size_t cap, uint32_t *imm, int *has_imm)
{
	struct msg *m = NULL;
	struct vc_rx rx;
	int err = vc_enter(v);
	if (err)
		return err;
	pthread_mutex_lock(&v->rxmu);
	if (v->shm) /* from the ring's slab into buf: its one copy here */
		err = vc_shm_next(v, buf, cap, 0, &rx, v->rto);
	else if ((err = next_msg(v, cap, &m)) == 0)
		rx = (struct vc_rx){.len = m->len, .imm = m->imm, .has_imm = m->has_imm};
	pthread_mutex_unlock(&v->rxmu);
	vc_leave(v);
	if (err)
		return err;
	if (m && m->len)
		memcpy(buf, m->data, m->len);
	free(m);
	if (imm)
		*imm = rx.imm;
	if (has_imm)
		*has_imm = rx.has_imm;
	return rx.len;
}

/* vconn_recv_fn is vconn_recv with fn in place of the copy into buf,
 * called under rxmu, as the ring's consumer: on shared memory the
 * descriptor is released only once fn returned (vc_shm_fn). */
ssize_t vconn_recv_fn(vconn *v, vconn_msg_fn *fn, void *arg)
{
	if (!fn) {
		vc_seterr("recv_fn: no function");
		return -EINVAL;
	}
	struct msg *m = NULL;
	struct vc_rx rx;
	int ret = 0;
	int err = vc_enter(v);
	if (err)
		return err;
	pthread_mutex_lock(&v->rxmu);
	if (v->shm) {
		err = vc_shm_fn(v, fn, arg, &rx, &ret, v->rto);
	} else if ((err = next_msg(v, (size_t)-1, &m)) == 0) {
		rx = (struct vc_rx){.len = m->len, .imm = m->imm, .has_imm = m->has_imm};
		ret = fn(arg, m->data, m->len, m->imm, m->has_imm);
	}
	pthread_mutex_unlock(&v->rxmu);
	vc_leave(v);
	free(m);
	if (err)
		return err;
	return ret < 0 ? ret : (ssize_t)rx.len;
}

static int reliable(int t) { return t == VCONN_TRANSPORT_UNKNOWN || t == VCONN_TRANSPORT_RC || t == VCONN_TRANSPORT_AUTO; }
int vconn_is_stream(vconn *v) { return reliable(v->transport); }

/* from_cur copies what a read can of the message it is in (rxmu held);
 * on shared memory, its buffer is kept for the next message split. */
static size_t from_cur(vconn *v, void *buf, size_t n)
{
	size_t k = v->cur->len - v->curoff;
	if (k > n)
		k = n;
	memcpy(buf, v->cur->data + v->curoff, k);
	v->curoff += k;
	if (v->curoff == v->cur->len) {
		if (v->shm && !v->spare)
			v->spare = v->cur;
		else
			free(v->cur);
		v->cur = NULL;
	}
	return k;
}

/* next_read reads from the next message (rxmu held): on shared memory
 * straight from the ring into buf, what does not fit into v->cur; on the
 * socket into v->cur, from which the caller reads. 0 and *k = 0 for an
 * empty message, skipped. */
static int next_read(vconn *v, void *buf, size_t n, size_t *k)
{
	*k = 0;
	if (v->shm) {
		struct vc_rx rx;
		int err = vc_shm_next(v, buf, n, 1, &rx, v->rto);
		if (!err)
			*k = rx.len < n ? rx.len : n;
		return err;
	}
	int err = next_msg(v, (size_t)-1, &v->cur);
	if (err)
		return err;
	v->curoff = 0;
	if (v->cur->len == 0) {
		free(v->cur);
		v->cur = NULL;
	}
	if (v->cur)
		*k = from_cur(v, buf, n);
	return 0;
}

ssize_t vconn_read(vconn *v, void *buf, size_t n)
{
	if (!reliable(v->transport)) {
		vc_seterr("read: a %d vconn may lose messages: use vconn_recv", v->transport);
		return -EPROTOTYPE;
	}
	if (n == 0)
		return 0;
	int err = vc_enter(v);
	if (err)
		return err;
	pthread_mutex_lock(&v->rxmu);
	size_t k = 0;
	if (v->cur)
		k = from_cur(v, buf, n);
	while (k == 0 && (err = next_read(v, buf, n, &k)) == 0)
		;
	pthread_mutex_unlock(&v->rxmu);
	vc_leave(v);
	if (err)
		return err == -ENODATA ? 0 : err;
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
