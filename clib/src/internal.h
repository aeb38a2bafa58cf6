/* libvconn internals. */
#ifndef VCONN_INTERNAL_H
#define VCONN_INTERNAL_H

#include "../vconn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#define VC_VERSION 1
#define VC_FLAG_IMM 1u
#define VC_FLAG_BRIDGE 2u
#define VC_FLAG_MEMFD 4u
#define VC_FEATURE_MEMFD 1u /* Hello's OK, arg2: Export takes VC_FLAG_MEMFD */

enum {
	VC_OP_HELLO = 1, VC_OP_LISTEN, VC_OP_DIAL, VC_OP_SEND, VC_OP_GRANT, VC_OP_CLOSE,
	VC_OP_EXPORT, VC_OP_UNEXPORT, VC_OP_LOCAL_READ, VC_OP_LOCAL_WRITE, VC_OP_WRITE,
	VC_OP_READ, VC_OP_OK, VC_OP_ERROR, VC_OP_DATA, VC_OP_EOF, VC_OP_ACCEPT, VC_OP_SHM,
	VC_OP_STAGE, VC_OP_LIMIT
};

uint32_t vc_get32(const uint8_t *p);
/* The allocation's socket, connected (bridge.c): a descriptor or -errno. */
int vc_agent_connect(const struct vconn_options *o);
void vc_put32(uint8_t *p, uint32_t v);

/* Shared memory (docs/protocol.md §5). */
#define VC_RING_HEADER 256
#define VC_DESC_LEN 16
#define VC_DESC_IMM 1u
#define VC_DESC_EOF 2u
#define VC_DESC_ERROR 4u
size_t vc_ring_len(const struct vconn_shm_layout *l);

struct vc_desc {
	uint32_t off, len, imm, flags;
};

struct vc_ring {
	_Atomic uint32_t *tail, *head, *cons_wait, *prod_wait;
	uint8_t *descs, *slab;
	uint32_t n, mask, slab_len, max_msg;
	int bell; /* this side's doorbell end */
};

struct vc_producer {
	struct vc_ring r;
	uint32_t tail, head;
	uint64_t data;
	uint64_t *starts;
};

struct vc_consumer {
	struct vc_ring r;
	uint32_t head, tail;
};

struct vc_shm {
	struct vconn_shm_layout l;
	uint8_t *mem;
	size_t size;
	struct vc_producer tx;
	struct vc_consumer rx;
	int txbell, rxbell;
};

/* vc_memfd_map maps size bytes of a memfd the agent passed, read-write and
 * shared, once it checked that fd is sealed against shrinking (so the
 * mapping cannot fault) and holds size bytes. fd stays the caller's. */
int vc_memfd_map(int fd, size_t size, uint8_t **mem);
/* vc_shm_open maps the segment from the descriptors the agent passed
 * (memfd, TX doorbell, RX doorbell), taking ownership of them. */
int vc_shm_open(struct vc_shm *s, const struct vconn_shm_layout *l, int fds[3]);
void vc_shm_close(struct vc_shm *s);
/* 1 pushed, 0 no room, <0 corrupt. */
int vc_shm_push(struct vc_producer *p, const void *b, uint32_t n, uint32_t imm, uint32_t flags);
void vc_shm_prod_arm(struct vc_producer *p);
int vc_shm_prod_empty(struct vc_producer *p);
/* 1 a descriptor (d, payload valid until release), 0 empty, <0 corrupt. */
int vc_shm_peek(struct vc_consumer *c, struct vc_desc *d, const uint8_t **payload);
void vc_shm_release(struct vc_consumer *c);
/* 1 when a descriptor arrived meanwhile (do not sleep). */
int vc_shm_cons_arm(struct vc_consumer *c);
/* Drains a doorbell; -ENOTCONN at its EOF. */
int vc_bell_drain(int fd);
int vc_desc_check(const struct vc_ring *r, const struct vc_desc *d);

/* The calling thread's last error message. */
void vc_seterr(const char *fmt, ...);

/* vc_client_bg_frames: frames c's background reader read, rather than a
 * thread of the program waiting for them (tests: test_lead.c). */
unsigned long vc_client_bg_frames(vconn_client *c);

#endif
