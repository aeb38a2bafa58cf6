/* A vconn's messages on shared memory (docs/protocol.md §5): the client
 * produces ring TX and consumes ring RX (shm.c). A sleeper also watches
 * the vconn's socket-side descriptor, so that a failure the socket
 * reports ends its wait. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int bell_sleep(vconn *v, int bell, const struct timespec *dl)
{
	struct pollfd p[2] = {{.fd = bell, .events = POLLIN}, {.fd = v->efd, .events = POLLIN}};
	int ms = dl ? vc_remaining_ms(dl) : -1;
	if (dl && ms == 0)
		return -ETIMEDOUT;
	int n = poll(p, 2, ms);
	if (n < 0 && errno != EINTR)
		return -errno;
	if (n > 0 && (p[0].revents & POLLIN) && vc_bell_drain(bell) == -ENOTCONN) {
		/* The agent dropped the segment: the vconn is over. Its reason
		 * may yet come on the socket; until then, this is it. */
		int err = vc_v_dead(v);
		if (!err) {
			pthread_mutex_lock(&v->c->mu);
			if (!v->err) {
				v->err = -ECONNRESET;
				snprintf(v->errmsg, sizeof v->errmsg, "the agent dropped the vconn's shared memory");
			}
			err = vc_fail_with(v, v->err);
			vc_v_ready(v);
			pthread_mutex_unlock(&v->c->mu);
		}
		return err;
	}
	return 0;
}

int vc_shm_send(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm)
{
	struct timespec ts;
	const struct timespec *dl = vc_deadline(v->wto, &ts) ? &ts : NULL;
	pthread_mutex_lock(&v->txmu);
	int err;
	for (;;) {
		if ((err = vc_v_dead(v)) != 0)
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

/* copy_out copies the message of d, at p in the slab, once (rxmu held),
 * before anyone looks at it, since the agent could rewrite the slab: its
 * first k bytes into buf, the rest into v->cur, in the spare buffer
 * (allocated once per vconn: no allocation per message). */
static int copy_out(vconn *v, const struct vc_desc *d, const uint8_t *p, void *buf, size_t k)
{
	if (k < d->len) {
		struct msg *m = v->spare;
		if (!m && !(m = malloc(sizeof *m + v->shm->rx.r.max_msg)))
			return -ENOMEM;
		v->spare = NULL;
		m->next = NULL;
		m->len = d->len - (uint32_t)k; /* at most max_msg: vc_desc_check */
		m->imm = d->imm;
		m->has_imm = d->flags & VC_DESC_IMM;
		memcpy(m->data, p + k, m->len);
		v->cur = m;
		v->curoff = 0;
	}
	if (k)
		memcpy(buf, p, k);
	return 0;
}

/* end_desc takes a descriptor that marks the vconn's end (rxmu held):
 * -ENODATA at EOF, or the vconn's error; 0, leaving it, for a message. */
static int end_desc(vconn *v, const struct vc_desc *d, const uint8_t *p)
{
	struct vc_consumer *rx = &v->shm->rx;
	if (d->flags & VC_DESC_EOF) {
		vc_shm_release(rx);
		pthread_mutex_lock(&v->c->mu);
		v->eof = 1;
		pthread_mutex_unlock(&v->c->mu);
		return -ENODATA;
	}
	if (d->flags & VC_DESC_ERROR) {
		pthread_mutex_lock(&v->c->mu);
		if (!v->err) {
			v->err = vconn_code_errno(d->imm);
			snprintf(v->errmsg, sizeof v->errmsg, "%.*s", (int)d->len, (const char *)p);
		}
		int err = vc_fail_with(v, v->err);
		pthread_mutex_unlock(&v->c->mu);
		vc_shm_release(rx);
		return err;
	}
	return 0;
}

/* take_desc takes the descriptor d at ring RX's head, p its payload
 * (rxmu held): its message copied out (vc_shm_next), or the end of the
 * vconn it marks. d is the copy vc_shm_peek checked: its length is read
 * once, whatever the agent writes meanwhile. */
static int take_desc(vconn *v, const struct vc_desc *d, const uint8_t *p, void *buf, size_t cap, int split,
		     struct vc_rx *out)
{
	int err = end_desc(v, d, p);
	if (err)
		return err;
	if (d->len > cap && !split) {
		vc_seterr("a message of %u bytes does not fit %zu", d->len, cap);
		return -EMSGSIZE;
	}
	if ((err = copy_out(v, d, p, buf, d->len < cap ? d->len : cap)) != 0)
		return err;
	vc_shm_release(&v->shm->rx); /* copied: the agent has the room back at once */
	out->len = d->len;
	out->imm = d->imm;
	out->has_imm = d->flags & VC_DESC_IMM;
	return 0;
}

/* wait_desc waits up to ms for a descriptor at ring RX's head (rxmu
 * held: the ring has one consumer): 1 with its checked copy in d and its
 * payload in p, or why none came. */
static int wait_desc(vconn *v, struct vc_desc *d, const uint8_t **p, int ms)
{
	struct timespec ts;
	const struct timespec *dl = vc_deadline(ms, &ts) ? &ts : NULL;
	struct vc_consumer *rx = &v->shm->rx;
	int err;
	for (;;) {
		err = vc_shm_peek(rx, d, p);
		if (err < 0) {
			pthread_mutex_lock(&v->c->mu);
			if (!v->err) {
				v->err = -EPROTO;
				snprintf(v->errmsg, sizeof v->errmsg, "%.200s", vconn_errmsg());
			}
			pthread_mutex_unlock(&v->c->mu);
			break;
		}
		if (err == 1)
			break;
		pthread_mutex_lock(&v->c->mu);
		err = v->eof ? -ENODATA : 0;
		pthread_mutex_unlock(&v->c->mu);
		if (err || (err = vc_v_dead(v)) != 0)
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

int vc_shm_next(vconn *v, void *buf, size_t cap, int split, struct vc_rx *out, int ms)
{
	struct vc_desc d;
	const uint8_t *p;
	int err = wait_desc(v, &d, &p, ms);
	return err == 1 ? take_desc(v, &d, p, buf, cap, split, out) : err;
}

int vc_shm_fn(vconn *v, vconn_msg_fn *fn, void *arg, struct vc_rx *out, int *ret, int ms)
{
	struct vc_desc d;
	const uint8_t *p;
	int err = wait_desc(v, &d, &p, ms);
	if (err != 1)
		return err;
	if ((err = end_desc(v, &d, p)) != 0)
		return err;
	out->len = d.len; /* d's: checked, and read once */
	out->imm = d.imm;
	out->has_imm = d.flags & VC_DESC_IMM;
	*ret = fn(arg, p, d.len, d.imm, out->has_imm);
	vc_shm_release(&v->shm->rx); /* fn is done with the slab: its room goes back */
	return 0;
}
