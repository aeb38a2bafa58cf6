/* The shared-memory rings (docs/protocol.md §5, internal/shm): the client
 * produces ring TX and consumes ring RX. Everything read from the mapping
 * is checked: the agent is trusted no more than the agent trusts us. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef F_GET_SEALS
#define F_GET_SEALS 1034
#endif
#ifndef F_SEAL_SHRINK
#define F_SEAL_SHRINK 0x0002
#endif

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void putle32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void ring_view(struct vc_ring *r, uint8_t *mem, const struct vconn_shm_layout *l, int bell)
{
	r->tail = (_Atomic uint32_t *)(void *)(mem + 0);
	r->head = (_Atomic uint32_t *)(void *)(mem + 64);
	r->cons_wait = (_Atomic uint32_t *)(void *)(mem + 128);
	r->prod_wait = (_Atomic uint32_t *)(void *)(mem + 192);
	r->descs = mem + VC_RING_HEADER;
	r->slab = r->descs + (size_t)l->entries * VC_DESC_LEN;
	r->n = l->entries;
	r->mask = l->entries - 1;
	r->slab_len = l->slab;
	r->max_msg = l->max_message;
	r->bell = bell;
}

static int is_stream_socket(int fd)
{
	int t = 0;
	socklen_t n = sizeof t;
	return getsockopt(fd, SOL_SOCKET, SO_TYPE, &t, &n) == 0 && t == SOCK_STREAM;
}

int vc_memfd_map(int fd, size_t size, uint8_t **mem)
{
	struct stat st;
	*mem = NULL;
	if (fstat(fd, &st) != 0) {
		int e = errno;
		vc_seterr("fstat of the memfd: %s", strerror(e));
		return -e;
	}
	if ((size_t)st.st_size < size) {
		vc_seterr("memfd of %lld bytes, %zu needed", (long long)st.st_size, size);
		return -EPROTO;
	}
	int seals = fcntl(fd, F_GET_SEALS);
	if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
		vc_seterr("the memfd is not sealed against shrinking");
		return -EPROTO;
	}
	void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		int e = errno;
		vc_seterr("mmap of the memfd: %s", strerror(e));
		return -e;
	}
	*mem = m;
	return 0;
}

int vc_shm_open(struct vc_shm *s, const struct vconn_shm_layout *l, int fds[3])
{
	int err = 0;
	memset(s, 0, sizeof *s);
	s->txbell = s->rxbell = -1;
	s->l = *l;
	s->size = vconn_shm_layout_size(l);
	if (!is_stream_socket(fds[1]) || !is_stream_socket(fds[2])) {
		err = -EPROTO;
		vc_seterr("shm: a doorbell is not a stream socket");
	}
	if (!err && (err = vc_memfd_map(fds[0], s->size, &s->mem)) != 0) {
		char why[400];
		snprintf(why, sizeof why, "%s", vconn_errmsg());
		vc_seterr("shm: %s", why);
	}
	if (!err) {
		s->tx.starts = calloc(l->entries, sizeof *s->tx.starts);
		if (!s->tx.starts)
			err = -ENOMEM;
	}
	close(fds[0]);
	if (err) {
		close(fds[1]);
		close(fds[2]);
		if (s->mem)
			munmap(s->mem, s->size);
		free(s->tx.starts);
		s->mem = NULL;
		s->tx.starts = NULL;
		return err;
	}
	s->txbell = fds[1];
	s->rxbell = fds[2];
	fcntl(s->txbell, F_SETFL, fcntl(s->txbell, F_GETFL) | O_NONBLOCK);
	fcntl(s->rxbell, F_SETFL, fcntl(s->rxbell, F_GETFL) | O_NONBLOCK);
	fcntl(s->txbell, F_SETFD, FD_CLOEXEC);
	fcntl(s->rxbell, F_SETFD, FD_CLOEXEC);
	size_t rl = vc_ring_len(l);
	ring_view(&s->tx.r, s->mem, l, s->txbell);
	ring_view(&s->rx.r, s->mem + rl, l, s->rxbell);
	return 0;
}

void vc_shm_close(struct vc_shm *s)
{
	if (s->mem)
		munmap(s->mem, s->size);
	s->mem = NULL;
	if (s->txbell >= 0)
		close(s->txbell);
	if (s->rxbell >= 0)
		close(s->rxbell);
	s->txbell = s->rxbell = -1;
	free(s->tx.starts);
	s->tx.starts = NULL;
}

static void ring_bell(int fd)
{
	static const uint8_t one = 1;
	ssize_t r = send(fd, &one, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
	(void)r; /* full: wake-ups are pending already */
}

int vc_bell_drain(int fd)
{
	uint8_t buf[64];
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
		if (n == 0)
			return -ENOTCONN;
		if (n < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -ENOTCONN;
		if ((size_t)n < sizeof buf)
			return 0;
	}
}

int vc_desc_check(const struct vc_ring *r, const struct vc_desc *d)
{
	if (d->flags & ~(VC_DESC_IMM | VC_DESC_EOF | VC_DESC_ERROR))
		return -EPROTO;
	if (d->len > r->max_msg)
		return -EPROTO;
	if (d->off > r->slab_len || d->len > r->slab_len - d->off)
		return -EPROTO;
	return 0;
}

int vc_shm_push(struct vc_producer *p, const void *b, uint32_t n, uint32_t imm, uint32_t flags)
{
	struct vc_ring *r = &p->r;
	if (n > r->max_msg)
		return -EMSGSIZE;
	uint32_t h = atomic_load(r->head);
	if (h - p->head > p->tail - p->head) {
		vc_seterr("shm: the agent moved ring TX's head to %u outside %u..%u", h, p->head, p->tail);
		return -EPROTO;
	}
	p->head = h;
	if (p->tail - p->head >= r->n)
		return 0;
	uint64_t slab = r->slab_len;
	uint64_t free_from = p->head != p->tail ? p->starts[p->head & r->mask] : p->data;
	uint64_t need = ((uint64_t)n + 63) & ~(uint64_t)63;
	uint64_t start = p->data;
	uint64_t pos = start % slab;
	if (pos + need > slab)
		start += slab - pos;
	if (start + need - free_from > slab)
		return 0;
	uint32_t off = (uint32_t)(start % slab);
	if (n)
		memcpy(r->slab + off, b, n);
	uint8_t *d = r->descs + (size_t)(p->tail & r->mask) * VC_DESC_LEN;
	putle32(d, off);
	putle32(d + 4, n);
	putle32(d + 8, imm);
	putle32(d + 12, flags & VC_DESC_IMM);
	p->starts[p->tail & r->mask] = p->data;
	p->data = start + need;
	p->tail++;
	atomic_store(r->tail, p->tail); /* publishes the descriptor and its bytes */
	if (atomic_load(r->cons_wait) != 0 && atomic_exchange(r->cons_wait, 0) != 0)
		ring_bell(r->bell);
	return 1;
}

void vc_shm_prod_arm(struct vc_producer *p) { atomic_store(p->r.prod_wait, 1); }

/* What was published against what was released: both atomics, so that a
 * closer may look while a sender holds the ring. */
int vc_shm_prod_empty(struct vc_producer *p) { return atomic_load(p->r.head) == atomic_load(p->r.tail); }

int vc_shm_peek(struct vc_consumer *c, struct vc_desc *d, const uint8_t **payload)
{
	struct vc_ring *r = &c->r;
	if (c->head == c->tail) {
		uint32_t t = atomic_load(r->tail);
		if (t - c->head > r->n) {
			vc_seterr("shm: the agent's ring RX tail %u, head %u, %u entries", t, c->head, r->n);
			return -EPROTO;
		}
		c->tail = t;
		if (t == c->head)
			return 0;
	}
	/* Copied out once, then checked: the agent cannot change it under us. */
	uint8_t raw[VC_DESC_LEN];
	memcpy(raw, r->descs + (size_t)(c->head & r->mask) * VC_DESC_LEN, VC_DESC_LEN);
	d->off = le32(raw);
	d->len = le32(raw + 4);
	d->imm = le32(raw + 8);
	d->flags = le32(raw + 12);
	if (vc_desc_check(r, d) != 0) {
		vc_seterr("shm: corrupt descriptor in ring RX: %u bytes at %u, flags %#x", d->len, d->off, d->flags);
		return -EPROTO;
	}
	*payload = r->slab + d->off;
	return 1;
}

void vc_shm_release(struct vc_consumer *c)
{
	if (c->head == c->tail)
		return;
	c->head++;
	atomic_store(c->r.head, c->head);
	if (atomic_load(c->r.prod_wait) != 0 && atomic_exchange(c->r.prod_wait, 0) != 0)
		ring_bell(c->r.bell);
}

int vc_shm_cons_arm(struct vc_consumer *c)
{
	atomic_store(c->r.cons_wait, 1);
	return c->head != c->tail || atomic_load(c->r.tail) != c->head;
}
