/* A vconn's staging memory (docs/protocol.md R3.30, R3.31): the memfd the
 * agent passes with Stage's OK, which this process maps, cut in
 * VC_STAGE_SLOTS slots. vconn_write_remote copies its bytes into a slot
 * and sends Write with VC_FLAG_MEMFD and the slot's span, not the bytes;
 * vconn_read_remote sends Read with the span and copies the bytes out of
 * the slot after the OK: one copy each, where frames took 5 and 6. Which
 * vconn has staging memory, and asking for it, is region.c's; the slots,
 * their copies and the requests on them are here. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* unref drops a hold on st, and frees it once none is left (mu held). */
static void unref(struct vc_stage *st)
{
	if (--st->refs > 0)
		return;
	pthread_rwlock_destroy(&st->maplock);
	free(st);
}

struct vc_stage *vc_stage_map(vconn_client *c, const struct vc_reply *r)
{
	size_t size = (size_t)r->f.arg2;
	if (r->nfds != 1 || size < VC_STAGE_SLOTS || size > VC_STAGE_SIZE)
		return NULL; /* not what was asked: frames, then */
	struct vc_stage *st = calloc(1, sizeof *st);
	if (!st)
		return NULL;
	if (vc_memfd_map(r->fds[0], size, &st->mem) != 0) {
		free(st);
		return NULL;
	}
	st->c = c;
	st->size = size;
	st->slot = size / VC_STAGE_SLOTS;
	st->free = (1u << VC_STAGE_SLOTS) - 1;
	st->refs = 1; /* the vconn's */
	pthread_rwlock_init(&st->maplock, NULL);
	for (int i = 0; i < VC_STAGE_SLOTS; i++)
		st->slots[i] = (struct vc_slot){st, i};
	return st;
}

int vc_stage_take(struct vc_stage *st)
{
	for (int i = 0; i < VC_STAGE_SLOTS; i++)
		if (st->free & (1u << i)) {
			st->free &= ~(1u << i);
			st->refs++; /* the stage outlives a slot its caller left */
			return i;
		}
	return -1;
}

void vc_stage_put(struct vc_stage *st, int i)
{
	vconn_client *c = st->c;
	st->free |= 1u << i;
	unref(st);
	vc_notify(c); /* a thread may wait for a slot */
}

/* slot_left gives back the slot of a request whose caller stopped
 * waiting, once the agent answered it (or never will): vc_leave's fn. */
static void slot_left(void *arg)
{
	struct vc_slot *s = arg;
	vc_stage_put(s->st, s->i);
}

/* copy copies n bytes into slot i from buf (in), or out of it into buf:
 * -EBADF once the memory is unmapped. */
static int copy(struct vc_stage *st, int i, void *buf, size_t n, int in)
{
	int err = 0;
	pthread_rwlock_rdlock(&st->maplock);
	if (!st->mem) {
		vc_seterr("the vconn's staging memory is unmapped");
		err = -EBADF;
	} else if (in) {
		memcpy(st->mem + (size_t)i * st->slot, buf, n);
	} else {
		memcpy(buf, st->mem + (size_t)i * st->slot, n);
	}
	pthread_rwlock_unlock(&st->maplock);
	return err;
}

int vc_stage_run(struct vc_stage *st, int i, struct vconn_frame *f, void *buf, size_t n)
{
	vconn_client *c = st->c;
	int err = n <= st->slot ? 0 : -EINVAL;
	if (!err && f->op == VC_OP_WRITE)
		err = copy(st, i, buf, n, 1);
	struct vc_leave lv = {.fn = slot_left, .arg = &st->slots[i]};
	if (!err) {
		uint8_t span[8];
		vc_put32(span, (uint32_t)((size_t)i * st->slot));
		vc_put32(span + 4, (uint32_t)n);
		f->flags = VC_FLAG_MEMFD;
		f->payload = span;
		f->len = sizeof span;
		err = vc_call_or_leave(c, f, c->timeout_ms, NULL, &lv);
		f->payload = NULL;
		f->len = 0;
	}
	if (!err && f->op == VC_OP_READ)
		err = copy(st, i, buf, n, 0);
	if (!lv.left) { /* else the agent may still use the slot: slot_left gives it back */
		pthread_mutex_lock(&c->mu);
		vc_stage_put(st, i);
		pthread_mutex_unlock(&c->mu);
	}
	return err;
}

void vc_stage_close(struct vc_stage *st)
{
	vconn_client *c = st->c;
	pthread_rwlock_wrlock(&st->maplock); /* waits for the copies inside */
	munmap(st->mem, st->size);
	st->mem = NULL;
	pthread_rwlock_unlock(&st->maplock);
	pthread_mutex_lock(&c->mu);
	unref(st);
	pthread_mutex_unlock(&c->mu);
}
