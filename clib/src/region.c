/* Regions (docs/protocol.md §3, Export to Write): vconn_export and
 * vconn_unexport, this side's regions (vconn_region_read, _write: copies
 * where the agent passed the region's memfd, else frames) and the peer's
 * (vconn_read_remote, _write_remote: RDMA READ and WRITE, their bytes in
 * the vconn's staging memory where the agent offers it, stage.c). */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* op runs one vconn operation in the vconn's order and waits for it. */
static int op(vconn *v, struct vconn_frame *f, struct vc_reply *r)
{
	vconn_client *c = v->c;
	int err = vc_enter(v);
	if (err)
		return err;
	pthread_mutex_lock(&c->mu);
	/* One-sided operations block: their reply is the result. */
	err = vc_acquire(v, c->timeout_ms, 0);
	if (err)
		err = vc_fail_with(v, err);
	pthread_mutex_unlock(&c->mu);
	if (!err) {
		f->handle = v->h;
		err = vc_call(c, f, c->timeout_ms, r);
		pthread_mutex_lock(&c->mu);
		v->outstanding--;
		vc_notify(c);
		pthread_mutex_unlock(&c->mu);
	}
	vc_leave(v);
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
	int err = vc_enter(v); /* v stays until the mapping is recorded */
	if (err)
		return err;
	struct vc_reply r = {0};
	err = op(v, &f, &r);
	if (!err) {
		*region = r.f.arg;
		if (memfd && r.nfds == 1)
			map_region(v, r.f.arg, r.fds[0], size);
	}
	vc_reply_free(&r);
	vc_leave(v);
	return err;
}

int vconn_unexport(vconn *v, uint32_t region)
{
	int err = vc_enter(v);
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
	vc_leave(v);
	return err;
}

/* region_copy copies n bytes of a mapped region at off into buf, or buf
 * into it when write: 0, -EACCES out of its bounds, -EBADF on a closed
 * vconn, or 1 when the region is not mapped here (the socket's, then). One
 * buffer and a direction, not a source and a destination of which one is
 * NULL: inlined, that NULL reached a memcpy the compiler could see
 * (-Wnonnull at -O3). */
static int region_copy(vconn *v, uint32_t region, uint64_t off, void *buf, size_t n, int write)
{
	int err = vc_enter(v);
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
	} else if (n > 0 && write) {
		memcpy(g->mem + off, buf, n);
	} else if (n > 0) {
		memcpy(buf, g->mem + off, n);
	}
	pthread_rwlock_unlock(&v->rgmu);
	vc_leave(v);
	return err;
}

static int copy_in(vconn *v, uint8_t opc, uint32_t region, uint64_t off, void *buf, size_t n)
{
	for (size_t done = 0; done < n;) {
		size_t k = n - done < VCONN_MAX_PAYLOAD ? n - done : VCONN_MAX_PAYLOAD;
		uint8_t len[4];
		vc_put32(len, (uint32_t)k);
		struct vconn_frame f = {.op = opc, .arg = region, .arg2 = off + done, .payload = len, .len = 4};
		struct vc_reply r = {0};
		int err = op(v, &f, &r);
		if (!err && r.f.len != k) {
			vc_seterr("%s: the agent returned %u bytes of %zu", vconn_op_name(opc), r.f.len, k);
			err = -EPROTO;
		}
		if (!err)
			memcpy((uint8_t *)buf + done, r.payload, k);
		vc_reply_free(&r);
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
	int rc = region_copy(v, region, off, buf, n, 0);
	return rc == 1 ? copy_in(v, VC_OP_LOCAL_READ, region, off, buf, n) : rc;
}

int vconn_region_write(vconn *v, uint32_t region, uint64_t off, const void *buf, size_t n)
{
	int rc = region_copy(v, region, off, (void *)buf, n, 1); /* only read from */
	return rc == 1 ? copy_out(v, VC_OP_LOCAL_WRITE, region, off, buf, n) : rc;
}

/* A vconn asks for staging memory once, whichever thread comes first;
 * the others wait for its answer. */
enum { STAGE_UNASKED, STAGE_ASKING, STAGE_SETTLED };

/* ask asks the agent for v's staging memory (Stage) and maps it: NULL
 * where it is refused or does not map (the operations stay in frames). A
 * Stage that timed out is not asked again: the agent may have made the
 * memory, and would refuse a second. */
static struct vc_stage *ask(vconn *v)
{
	struct vconn_frame f = {.op = VC_OP_STAGE, .arg2 = VC_STAGE_SIZE};
	struct vc_reply r = {0};
	struct vc_stage *st = op(v, &f, &r) == 0 ? vc_stage_map(v->c, &r) : NULL;
	vc_reply_free(&r);
	return st;
}

/* staging finds v's staging memory, asking for it on first use: 0 and
 * *st (NULL: none, frames then), or an error while waiting for the asker. */
static int staging(vconn *v, struct vc_stage **st)
{
	vconn_client *c = v->c;
	struct timespec ts;
	const struct timespec *dl = vc_deadline(c->timeout_ms, &ts) ? &ts : NULL;
	int err = 0;
	pthread_mutex_lock(&c->mu);
	while (!err && v->stage_state == STAGE_ASKING)
		err = v->closed ? -EBADF : vc_cv_wait(c, dl);
	int asking = !err && v->stage_state == STAGE_UNASKED;
	if (asking)
		v->stage_state = STAGE_ASKING;
	*st = v->stage;
	pthread_mutex_unlock(&c->mu);
	if (!asking)
		return vc_fail_with(v, err);
	struct vc_stage *got = ask(v);
	pthread_mutex_lock(&c->mu);
	v->stage = *st = got;
	v->stage_state = STAGE_SETTLED;
	vc_notify(c); /* the threads waiting for the answer */
	pthread_mutex_unlock(&c->mu);
	return 0;
}

/* claim takes a free slot of st into *at, then a place in v's send window
 * (mu held): the slot first, so that a thread waiting for one holds no
 * place another could use. */
static int claim(vconn *v, struct vc_stage *st, int *at)
{
	vconn_client *c = v->c;
	struct timespec ts;
	const struct timespec *dl = vc_deadline(c->timeout_ms, &ts) ? &ts : NULL;
	while ((*at = vc_stage_take(st)) < 0) {
		int err = v->closed ? -EBADF : v->err ? v->err : c->err;
		if (!err)
			err = vc_cv_wait(c, dl);
		if (err)
			return err;
	}
	int err = vc_acquire(v, c->timeout_ms, 0);
	if (err)
		vc_stage_put(st, *at);
	return err;
}

/* staged runs vconn_write_remote or _read_remote through v's staging
 * memory, in pieces of at most a slot: 1 where v has none (frames, then).
 * Each piece holds its slot and its place in the send window only while
 * it runs, so threads of the program run up to VC_STAGE_SLOTS at once. */
static int staged(vconn *v, uint8_t opc, uint32_t region, uint64_t off, uint8_t *buf, size_t n)
{
	vconn_client *c = v->c;
	if (n == 0 || !(c->features & VC_FEATURE_STAGE))
		return 1;
	int err = vc_enter(v); /* v, and its staging memory, stay until we leave */
	if (err)
		return err;
	struct vc_stage *st = NULL;
	if ((err = staging(v, &st)) == 0 && !st)
		err = 1;
	for (size_t done = 0; !err && done < n;) {
		size_t k = n - done < st->slot ? n - done : st->slot;
		int at;
		pthread_mutex_lock(&c->mu);
		err = claim(v, st, &at);
		if (err)
			err = vc_fail_with(v, err);
		pthread_mutex_unlock(&c->mu);
		if (err)
			break;
		struct vconn_frame f = {.op = opc, .handle = v->h, .arg = region, .arg2 = off + done};
		err = vc_stage_run(st, at, &f, buf + done, k);
		pthread_mutex_lock(&c->mu);
		v->outstanding--;
		vc_notify(c);
		pthread_mutex_unlock(&c->mu);
		done += k;
	}
	vc_leave(v);
	return err;
}

int vconn_read_remote(vconn *v, uint32_t region, uint64_t off, void *buf, size_t n)
{
	int rc = staged(v, VC_OP_READ, region, off, buf, n);
	return rc == 1 ? copy_in(v, VC_OP_READ, region, off, buf, n) : rc;
}

int vconn_write_remote(vconn *v, uint32_t region, uint64_t off, const void *buf, size_t n)
{
	int rc = staged(v, VC_OP_WRITE, region, off, (uint8_t *)buf, n); /* only read from */
	return rc == 1 ? copy_out(v, VC_OP_WRITE, region, off, buf, n) : rc;
}

