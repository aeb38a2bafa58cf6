/* libvconn internals: what its files share. None of it is public: every
 * function here is vc_-prefixed and hidden in libvconn.so.
 *
 * The files are layers, as pkg/vconn's are files: each calls only into
 * the layers below it, so that no two files call each other (a circle);
 * clib's Go test TestCLayers checks it on the objects, with nm.
 *
 *   client.c    vconn_client_open and _close, and what the session hands
 *               up: frames for vconns and listeners, its failure
 *   listener.c  listeners: listen, accept, shutdown, close
 *   region.c    regions: export, region_read/_write, read/write_remote
 *   io.c        messages and the byte stream: send, recv, read, write
 *   dial.c      dial, dial_socket; "host:port"
 *   shm_io.c    a vconn's messages on its shared-memory rings
 *   vconn.c     a vconn's life and waits: make, start, wait, fd, close
 *   stage.c     a vconn's staging memory: its slots, their copies, the
 *               requests on them (region.c's read/write_remote)
 *   session.c   the session on the allocation's socket: frames out,
 *               requests and their replies, who reads the socket (cv_wait,
 *               lead, the background reader), the session's failure
 *   bridge.c    bridged vconns without a client (vconn_bridge_*)
 *   agent.c     connecting to the allocation's socket
 *   shm.c       the shared-memory rings
 *   frame.c     the codec and the error codes
 *   errors.c    the calling thread's last error message
 *
 * The session reads frames that are for vconns and listeners, and fails
 * them when it breaks, yet it never calls into the files above it, nor
 * looks inside a vconn or a listener: it hands those events up through
 * the function pointers of struct vc_session_hooks, which client.c gives
 * it when it opens the session. One mutex (c->mu) guards a client's
 * state, vconns and listeners included (session.c says why). */
#ifndef VCONN_INTERNAL_H
#define VCONN_INTERNAL_H

#include "../vconn.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#define VC_VERSION 1
#define VC_FLAG_IMM 1u
#define VC_FLAG_BRIDGE 2u
#define VC_FLAG_MEMFD 4u
#define VC_FEATURE_MEMFD 1u /* Hello's OK, arg2: Export takes VC_FLAG_MEMFD */
#define VC_FEATURE_STAGE 2u /* Hello's OK, arg2: Stage, and Write and Read with VC_FLAG_MEMFD */

enum {
	VC_OP_HELLO = 1, VC_OP_LISTEN, VC_OP_DIAL, VC_OP_SEND, VC_OP_GRANT, VC_OP_CLOSE,
	VC_OP_EXPORT, VC_OP_UNEXPORT, VC_OP_LOCAL_READ, VC_OP_LOCAL_WRITE, VC_OP_WRITE,
	VC_OP_READ, VC_OP_OK, VC_OP_ERROR, VC_OP_DATA, VC_OP_EOF, VC_OP_ACCEPT, VC_OP_SHM,
	VC_OP_STAGE, VC_OP_LIMIT
};

/* errors.c */

#define VC_ERRMSG_LEN 512 /* vconn_errmsg's buffer */
/* The calling thread's last error message. */
void vc_seterr(const char *fmt, ...);

/* frame.c */

uint32_t vc_get32(const uint8_t *p);
void vc_put32(uint8_t *p, uint32_t v);

/* agent.c */

/* The allocation's socket, connected: a descriptor or -errno. */
int vc_agent_connect(const struct vconn_options *o);

/* shm.c: shared memory (docs/protocol.md §5). */

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

/* session.c: the session (docs/protocol.md §1, §3). */

/* Messages of a vconn the agent may push ahead of the application's reads
 * (the receive window); more is granted each time half is consumed. */
#define VC_RECV_WINDOW 32

/* Who reads the session's socket (vconn_client.leader): see vc_cv_wait. */
enum { LEAD_NONE, LEAD_BG, LEAD_APP };

/* What the session hands up, to the layer that opened it (client.c);
 * each is called with c->mu held. */
struct vc_session_hooks {
	/* frame: a frame that answers no request (a vconn's or a listener's,
	 * or the agent's last); it takes the descriptors fds. */
	void (*frame)(vconn_client *c, const struct vconn_frame *f, int *fds, int nfds);
	/* broken: the session broke (c->err is err): fail what it holds. */
	void (*broken)(vconn_client *c, int err, const char *msg);
	/* settled: v's asynchronous send (vc_add_send) was answered, f with
	 * err 0 or its error, or never will be (err 0, f NULL): its slot of
	 * the send window is free. */
	void (*settled)(vconn *v, int err, const struct vconn_frame *f);
};

struct pending;

struct vconn_client {
	int fd;
	pthread_t reader;
	int reader_started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	/* The socket has one reader at a time (leader; guarded by mu): a
	 * thread of the program waiting in vc_cv_wait, or the background
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
	const struct vc_session_hooks *hooks;
	vconn *vconns;
	vconn_listener *lns;
	struct vconn_hello_info info;
	uint64_t features; /* what the agent offers (Hello's OK, arg2) */
	int want_shm, timeout_ms;
	pthread_mutex_t wmu; /* serialises writes; guards wbuf */
	uint8_t wbuf[VCONN_MAX_FRAME];
};

/* vc_reply is what vc_call returns: the OK frame, with its payload copied. */
struct vc_reply {
	struct vconn_frame f;
	uint8_t *payload;
	int fds[3], nfds;
};

/* Deadlines on CLOCK_MONOTONIC: vc_deadline sets ts ms from now (0 and
 * ts untouched when ms < 0: no deadline). */
int vc_deadline(int ms, struct timespec *ts);
int vc_remaining_ms(const struct timespec *ts);

/* vc_session_init starts the session of c on fd (c zeroed but for its
 * options): its locks, its kick, its background reader. On failure the
 * caller closes c. vc_session_end stops it and frees its requests;
 * vc_session_free frees c, once the layers above freed theirs. */
int vc_session_init(vconn_client *c, int fd, const struct vc_session_hooks *hooks);
void vc_session_end(vconn_client *c);
void vc_session_free(vconn_client *c);

/* vc_notify wakes the waiters of a change made outside the socket's
 * frames (mu held), the leader too. */
void vc_notify(vconn_client *c);
/* vc_set_async makes the background reader the socket's only reader (mu
 * held): a program polling descriptors waits outside vc_cv_wait. */
void vc_set_async(vconn_client *c);
/* vc_cv_wait waits (mu held) for what the socket or another thread
 * brings, until dl (NULL: none): -ETIMEDOUT, or the session's error. */
int vc_cv_wait(vconn_client *c, const struct timespec *dl);
/* vc_fail breaks the session (mu held): every waiter and vconn fails. */
void vc_fail(vconn_client *c, int err, const char *msg);

int vc_write_frame(vconn_client *c, const struct vconn_frame *f);
/* vc_call sends a request and waits for its reply, for at most ms. */
int vc_call(vconn_client *c, struct vconn_frame *f, int ms, struct vc_reply *out);
/* What becomes of a request that vc_call_or_leave stopped waiting for. */
struct vc_leave {
	void (*fn)(void *arg); /* runs once, mu held: at its reply, or when the session breaks or ends */
	void *arg;
	int left; /* set by vc_call_or_leave: the request went out unanswered, and fn will run */
};
/* vc_call_or_leave is vc_call, but a request that went out and was not
 * answered in time stays registered, and lv->fn runs once its fate is
 * known: for requests on memory the agent may still be using. */
int vc_call_or_leave(vconn_client *c, struct vconn_frame *f, int ms, struct vc_reply *out, struct vc_leave *lv);
void vc_reply_free(struct vc_reply *r);
/* vc_send_discard sends a request whose reply nobody waits for. */
void vc_send_discard(vconn_client *c, struct vconn_frame *f);
/* vc_add_send registers f as v's asynchronous send (mu held): its reply
 * settles it (hooks->settled). 0, or -ENOMEM. */
int vc_add_send(vconn_client *c, struct vconn_frame *f, vconn *v);
/* vc_close_later registers a Close of handle h, which the reader sends
 * once the frame it dispatches is done (mu held): an Accept nobody takes. */
void vc_close_later(vconn_client *c, uint32_t h);
/* vc_session_forget: no reply settles v's sends any more (mu held). */
void vc_session_forget(vconn_client *c, vconn *v);

/* vc_client_bg_frames: frames c's background reader read, rather than a
 * thread of the program waiting for them (tests: test_lead.c). */
unsigned long vc_client_bg_frames(vconn_client *c);

/* stage.c: a vconn's staging memory (docs/protocol.md R3.30, R3.31). */

#define VC_STAGE_SIZE (256u << 10) /* asked for, once per vconn */
#define VC_STAGE_SLOTS 4

struct vc_stage;
struct vc_slot {
	struct vc_stage *st;
	int i;
};

/* A slot is its operation's from the copy in until the agent answered,
 * even when the caller stopped waiting: the agent may still use it. */
struct vc_stage {
	vconn_client *c;
	/* Copies hold maplock shared, the unmap exclusively: no copy
	 * touches unmapped memory. */
	pthread_rwlock_t maplock;
	uint8_t *mem; /* NULL once unmapped; guarded by maplock */
	size_t size, slot;
	unsigned free; /* a bit per free slot; guarded by c->mu */
	int refs;      /* the vconn's, and one per slot taken; guarded by c->mu */
	struct vc_slot slots[VC_STAGE_SLOTS];
};

/* vc_stage_map maps the staging memory that r, Stage's OK, passed: NULL
 * where it cannot (the operations stay in frames). */
struct vc_stage *vc_stage_map(vconn_client *c, const struct vc_reply *r);
/* vc_stage_take takes a free slot (mu held): its index, or -1 if none. */
int vc_stage_take(struct vc_stage *st);
/* vc_stage_put gives slot i back (mu held). */
void vc_stage_put(struct vc_stage *st, int i);
/* vc_stage_run sends f (Write or Read on handle f->handle, region f->arg,
 * offset f->arg2) with n bytes (at most a slot) staged in slot i, which
 * the caller took: buf is copied in before a Write, out after a Read's
 * OK. The slot is given back once the agent answered: here, or by the
 * answer (or the session's end) if the wait timed out. */
int vc_stage_run(struct vc_stage *st, int i, struct vconn_frame *f, void *buf, size_t n);
/* vc_stage_close unmaps the staging memory of a vconn that ends (mu not
 * held); it is freed once no slot is taken. */
void vc_stage_close(struct vc_stage *st);

/* vconn.c: vconns. */

struct msg {
	struct msg *next;
	uint32_t len, imm;
	int has_imm;
	uint8_t data[];
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
	struct msg *spare; /* on shared memory, cur's buffer between uses (ring RX's largest message) */
	int eof, err, send_err, closed;
	int users; /* calls inside: vconn_close waits for them to leave */
	char errmsg[256];
	int consumed, outstanding;
	int efd, efd_set;
	int watched; /* vconn_fd was asked: efd follows readiness (vc_v_ready) */
	int nonblock, rto, wto;
	struct vc_shm *shm;
	pthread_mutex_t txmu, rxmu; /* the rings' single producer and consumer */
	/* Mapped regions: copies hold rgmu shared, unexport and close hold it
	 * exclusively to unmap, so no copy touches unmapped memory. */
	pthread_rwlock_t rgmu;
	struct vc_region *regions; /* guarded by rgmu */
	struct vc_stage *stage;    /* staging memory, or NULL; guarded by c->mu */
	int stage_state;           /* STAGE_UNASKED, _ASKING, _SETTLED (region.c); guarded by c->mu */
};

/* vc_new_vconn makes a vconn of handle h in c (mu held); info is the
 * reply's arg2 (transport, largest message). */
vconn *vc_new_vconn(vconn_client *c, uint32_t h, uint64_t info, const uint8_t *remote, uint32_t rlen);
void vc_destroy_vconn(vconn *v);
vconn *vc_find_vconn(vconn_client *c, uint32_t h);
/* vc_efd_set makes the eventfd fd readable, or not (*set: it is). */
void vc_efd_set(int fd, int *set, int ready);
/* vc_v_ready keeps v's descriptor readable exactly while a read would
 * not block (mu held). */
void vc_v_ready(vconn *v);
/* vc_enter and vc_leave bracket a call on v, so that vconn_close, which
 * wakes the calls inside, frees v only once they left. */
int vc_enter(vconn *v);
void vc_leave(vconn *v);
/* vc_fail_with returns err, with v's message when err is v's. */
int vc_fail_with(vconn *v, int err);
/* vc_v_dead: v's error, its session's, or -EBADF once closed; 0 while it
 * lives (mu not held). */
int vc_v_dead(vconn *v);
/* vc_acquire takes a slot of the send window (mu held). */
int vc_acquire(vconn *v, int ms, int nonblock);
/* vc_hand_over opens a new vconn's receive path (shared memory if the
 * client asked and the agent agrees, else the socket's window) and hands
 * v to the program in *out; one that does not open is closed. */
int vc_hand_over(vconn *v, vconn **out);
/* vc_drop_vconn closes a vconn the program never had. */
void vc_drop_vconn(vconn *v);

/* shm_io.c */

int vc_shm_send(vconn *v, const void *b, size_t n, uint32_t imm, int has_imm);
/* A message vc_shm_next took: its whole length, its immediate. */
struct vc_rx {
	uint32_t len, imm;
	int has_imm;
};
/* vc_shm_next takes the next message off ring RX (rxmu held), waiting
 * up to ms, and copies it once, straight from the slab: into buf, or,
 * when it is longer than cap, -EMSGSIZE, keeping it on the ring; with
 * split, its first cap bytes into buf and the rest into v->cur (a stream
 * read's). -ENODATA at EOF. */
int vc_shm_next(vconn *v, void *buf, size_t cap, int split, struct vc_rx *out, int ms);
/* vc_shm_fn takes the next message off ring RX likewise, and calls fn
 * with it in place, in the slab, before it releases the descriptor: *ret
 * is fn's return. No copy, no allocation. */
int vc_shm_fn(vconn *v, vconn_msg_fn *fn, void *arg, struct vc_rx *out, int *ret, int ms);

/* dial.c */

/* vc_split_addr parses "host:port" (IPv6 in brackets). */
int vc_split_addr(const char *addr, char *host, size_t hcap, unsigned *port);

/* listener.c: listeners. */

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

vconn_listener *vc_find_listener(vconn_client *c, uint32_t h);
void vc_l_ready(vconn_listener *l);
/* vc_listener_destroy frees l, whose client is closing. */
void vc_listener_destroy(vconn_listener *l);

#endif
