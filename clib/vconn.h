/*
 * libvconn: RDMAvisor vconns from C.
 *
 * A client speaks the pod protocol (docs/protocol.md) to its node's agent
 * over the allocation's unix socket ($RDMAVISOR_SOCKET). A vconn is a
 * connection to a peer: a byte stream (vconn_read, vconn_write), messages
 * with optional 32-bit immediates (vconn_send, vconn_recv), and one-sided
 * access to memory a peer exported (vconn_export, vconn_read_remote...).
 *
 * Errors: every function that can fail returns a negative errno value
 * (-ECONNREFUSED, -ETIMEDOUT, -EAGAIN...); vconn_strerror names it, and
 * vconn_errmsg gives the agent's own message for the calling thread's last
 * failure. The agent's protocol codes map to errno values as listed below.
 *
 * Threads: a thread waiting in a call reads the agent's socket itself, and
 * a background thread reads it while none waits. Every function is safe to
 * call from any thread; concurrent writers of one vconn interleave whole
 * messages.
 *
 * Polling: vconn_fd returns a descriptor that is readable when vconn_recv
 * (or vconn_read) would not block: a message, the peer's EOF or a failure
 * is waiting. vconn_listener_fd is readable when vconn_accept would not
 * block. Combined with vconn_set_nonblock (calls return -EAGAIN instead of
 * waiting) an event loop can serve many vconns, and a bridge (an
 * LD_PRELOAD socketpair, say) can poll them beside kernel sockets. Each
 * vconn has its own descriptor, so one thread per vconn, or one poll over
 * all of them, both work.
 *
 * Shared memory (vconn_options.shared_memory): a vconn's messages travel
 * in rings the agent maps for it; vconn_fd is then the ring's doorbell,
 * which is made readable by a message that arrives after a vconn_recv
 * returned -EAGAIN (or vconn_wait looked): poll after -EAGAIN, and treat
 * a wake-up as a hint (vconn_recv may return -EAGAIN again). A failure
 * the agent reports on the socket for a shared-memory vconn shows at the
 * next call, not on the descriptor.
 *
 * Fork: a client and its vconns belong to the process that opened them.
 */
#ifndef VCONN_H
#define VCONN_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define VCONN_API __attribute__((visibility("default")))
#else
#define VCONN_API
#endif

#define VCONN_VERSION_MAJOR 0
#define VCONN_VERSION_MINOR 1

/* The protocol's limits (docs/protocol.md §2). */
#define VCONN_HEADER_LEN 28
#define VCONN_MAX_PAYLOAD 65536
#define VCONN_MAX_FRAME (VCONN_HEADER_LEN + VCONN_MAX_PAYLOAD)

typedef struct vconn_client vconn_client;
typedef struct vconn vconn;
typedef struct vconn_listener vconn_listener;

/* Options of a client; zeroed means: everything from the environment. */
struct vconn_options {
	const char *socket;  /* the allocation's socket (default $RDMAVISOR_SOCKET) */
	int shared_memory;   /* nonzero: ask the agent for shared-memory rings per vconn */
	int timeout_ms;      /* bound on Hello, Dial, Listen and other requests; 0: 30 s, <0: none */
};

/* Transports a vconn reports (VConnInfo). */
enum vconn_transport {
	VCONN_TRANSPORT_UNKNOWN = 0,
	VCONN_TRANSPORT_RC = 1,
	VCONN_TRANSPORT_UC = 2,
	VCONN_TRANSPORT_UD = 3,
	VCONN_TRANSPORT_AUTO = 4,
};

/* Region access, for vconn_export. */
#define VCONN_ACCESS_READ 1
#define VCONN_ACCESS_WRITE 2

/* Client. */
VCONN_API int vconn_client_open(vconn_client **out, const struct vconn_options *opts);
/* Closes the connection to the agent, and with it every vconn and
 * listener of the client: their pointers are invalid afterwards. */
VCONN_API void vconn_client_close(vconn_client *c);
VCONN_API int vconn_client_quota(vconn_client *c);          /* vconns the allocation may hold open */
VCONN_API int vconn_client_send_window(vconn_client *c);    /* operations of one vconn that may be unanswered */
VCONN_API int vconn_client_max_message(vconn_client *c);    /* largest message of any vconn */
VCONN_API const char *vconn_client_node(vconn_client *c);   /* the agent's node name */

/* Connections. addr is "host:port": a pod IP, a node's IP or name, or a
 * name the library resolves (getaddrinfo) when the agent does not know it. */
VCONN_API int vconn_dial(vconn_client *c, const char *addr, vconn **out);
/* addr is ":port" (or "host:port" with the allocation's own host). */
VCONN_API int vconn_listen(vconn_client *c, const char *addr, vconn_listener **out);
VCONN_API int vconn_accept(vconn_listener *l, vconn **out);

/* Bridged vconns (docs/protocol.md, FlagBridge): the agent hands each
 * vconn over as a kernel stream socket and copies between it and the
 * vconn, for code that knows only sockets (poll, epoll, fork, dup and
 * sendfile work on it as on TCP). The socket is the vconn: read and write
 * it, shutdown(SHUT_WR) half-closes, close(2) closes; it outlives the
 * client. vconn_dial_socket returns the socket in *fd; a listener made
 * with vconn_listen_socket accepts sockets with vconn_accept_socket. */
VCONN_API int vconn_dial_socket(vconn_client *c, const char *addr, int *fd);
VCONN_API int vconn_listen_socket(vconn_client *c, const char *addr, vconn_listener **out);
VCONN_API int vconn_accept_socket(vconn_listener *l, int *fd);
/* The same without a client, for code that must survive fork and keeps
 * no library state (the preload library): each call opens its own
 * connection to the agent (o as for vconn_client_open; NULL: from the
 * environment). vconn_bridge_dial returns the socket (flags: SOCK_NONBLOCK,
 * SOCK_CLOEXEC). vconn_bridge_listen returns a descriptor that is the
 * listener itself: readable when a vconn arrives, shared by fork, closed
 * with close(2); the address bound goes into bound if not NULL.
 * vconn_bridge_accept takes one vconn's socket from it (-EAGAIN when the
 * descriptor is non-blocking and none waits; remote gets the peer's
 * address if not NULL). Each returns a descriptor, or -errno. */
VCONN_API int vconn_bridge_dial(const struct vconn_options *o, const char *addr, int flags);
VCONN_API int vconn_bridge_listen(const struct vconn_options *o, const char *addr, char *bound, size_t cap);
VCONN_API int vconn_bridge_accept(int lfd, int flags, char *remote, size_t cap);
VCONN_API int vconn_listener_fd(vconn_listener *l);
VCONN_API const char *vconn_listener_addr(vconn_listener *l);
VCONN_API int vconn_listener_set_nonblock(vconn_listener *l, int on);
VCONN_API int vconn_listener_set_timeout(vconn_listener *l, int timeout_ms); /* <0: none */
/* Stops listening: accepts inside and after return -EBADF, and vconns
 * accepted but not taken are closed; l stays valid until
 * vconn_listener_close, so that threads in vconn_accept can be joined
 * first. */
VCONN_API int vconn_listener_shutdown(vconn_listener *l);
/* Shuts the listener down if it is not yet, and frees it: no call may be
 * inside or follow. */
VCONN_API int vconn_listener_close(vconn_listener *l);

/* Byte stream: only on reliable transports (rc, auto), else -EPROTOTYPE.
 * vconn_read returns 0 at the peer's EOF; vconn_write returns the bytes
 * written (all of them, unless non-blocking or a deadline cut it short). */
VCONN_API ssize_t vconn_read(vconn *v, void *buf, size_t n);
VCONN_API ssize_t vconn_write(vconn *v, const void *buf, size_t n);

/* Messages of at most vconn_max_message bytes (larger: -EMSGSIZE). */
VCONN_API int vconn_send(vconn *v, const void *buf, size_t n);
VCONN_API int vconn_send_imm(vconn *v, const void *buf, size_t n, uint32_t imm);
/* Receives one message whole into buf: its length, 0 for an empty one;
 * -EMSGSIZE (the message stays queued) if cap is too small; at EOF
 * -ENODATA. imm and has_imm may be NULL. */
VCONN_API ssize_t vconn_recv(vconn *v, void *buf, size_t cap, uint32_t *imm, int *has_imm);
/* Receives one message without copying it where the vconn can: waits
 * as vconn_recv does, then calls fn with the message's len bytes at data,
 * its immediate and has_imm. On shared memory data points into the
 * receive ring's memory (shared with the agent, which leaves it alone
 * until fn returns; then it has the room back): valid only while fn
 * runs, and not to be kept. On the socket it is the queued message,
 * freed after fn. fn runs holding v's receive lock: it must not receive
 * (vconn_recv, vconn_read, vconn_recv_fn), wait (vconn_wait) or close on
 * v, nor close the client; other threads' receives on v wait, and their
 * vconn_close waits for fn to return. Returns fn's return value if it is
 * negative (the message is taken all the same), else the message's
 * length; at EOF -ENODATA, without calling fn; -EINVAL if fn is NULL. */
typedef int vconn_msg_fn(void *arg, const void *data, size_t len, uint32_t imm, int has_imm);
VCONN_API ssize_t vconn_recv_fn(vconn *v, vconn_msg_fn *fn, void *arg);

/* Closes the vconn after what was sent has been handed over (waiting up
 * to 5 s); the peer reads EOF. Calls of other threads blocked on v return
 * -EBADF first; then v is freed, and no call may follow. */
VCONN_API int vconn_close(vconn *v);

/* Deadlines and modes. Timeouts in milliseconds, <0: wait for ever; a
 * call that times out returns -ETIMEDOUT. In non-blocking mode a call
 * that would wait returns -EAGAIN. */
VCONN_API int vconn_set_timeouts(vconn *v, int read_ms, int write_ms);
VCONN_API int vconn_set_nonblock(vconn *v, int on);
VCONN_API int vconn_fd(vconn *v);
/* Waits until v is readable (events & 1) or writable (events & 2), for
 * at most timeout_ms: the events ready, 0 on timeout, or -errno. On
 * shared memory, writable is reported at once: vconn_send finds out. */
#define VCONN_POLLIN 1
#define VCONN_POLLOUT 2
VCONN_API int vconn_wait(vconn *v, int events, int timeout_ms);

/* What the agent said of v. */
VCONN_API int vconn_max_message(vconn *v);
VCONN_API int vconn_transport(vconn *v);
VCONN_API int vconn_is_stream(vconn *v);   /* the transport is reliable: read and write work */
VCONN_API int vconn_is_shm(vconn *v);      /* messages travel in shared memory */
VCONN_API const char *vconn_remote_addr(vconn *v);
VCONN_API uint32_t vconn_handle(vconn *v);

/* Regions. vconn_export registers size bytes in the agent and exports
 * them to the peer with access; *region names it (tell the peer). */
VCONN_API int vconn_export(vconn *v, size_t size, int access, uint32_t *region);
VCONN_API int vconn_unexport(vconn *v, uint32_t region);
/* Copies to and from this side's exported region: memcpy on the memfd the
 * agent passed with the export (FeatureMemfd), else frames. */
VCONN_API int vconn_region_read(vconn *v, uint32_t region, uint64_t off, void *buf, size_t n);
VCONN_API int vconn_region_write(vconn *v, uint32_t region, uint64_t off, const void *buf, size_t n);
/* RDMA READ and WRITE of the peer's region: their bytes go through the
 * vconn's staging memory where the agent offers it (FeatureStage: one
 * copy, in slots that threads use side by side), else in frames. */
VCONN_API int vconn_read_remote(vconn *v, uint32_t region, uint64_t off, void *buf, size_t n);
VCONN_API int vconn_write_remote(vconn *v, uint32_t region, uint64_t off, const void *buf, size_t n);

/* Errors. */
VCONN_API const char *vconn_strerror(int err);
VCONN_API const char *vconn_errmsg(void);   /* the calling thread's last failure, in words */

/*
 * Protocol codes and their errno values:
 *   1 BadRequest -EINVAL          10 TooLarge     -EMSGSIZE
 *   2 Version    -EPROTONOSUPPORT 11 Internal     -EIO
 *   3 Quota      -EDQUOT          12 AddrInUse    -EADDRINUSE
 *   4 NoHandle   -EBADF           13 Region       -EACCES
 *   5 Refused    -ECONNREFUSED    14 Window       -ENOBUFS
 *   6 Unreachable -EHOSTUNREACH   15 ShuttingDown -ESHUTDOWN
 *   7 Closed     -EPIPE           16 Limit        -ENOSPC
 *   8 Reset      -ECONNRESET      17 NoAddress    -EADDRNOTAVAIL
 *   9 PeerGone   -EHOSTDOWN       18 UnknownHost  -ENXIO
 *   other codes  -EREMOTEIO
 * and the library's own: the agent's connection broke -ENOTCONN; the agent
 * sent a malformed frame -EPROTO; a stream on an unreliable transport
 * -EPROTOTYPE; EOF on vconn_recv -ENODATA.
 */
VCONN_API int vconn_code_errno(uint32_t code);

/*
 * The protocol codec, for tools and tests: what the client uses on every
 * datagram. vconn_frame_decode checks a datagram as docs/protocol.md §2
 * says and returns 0, or -EPROTO with *why (if why is not NULL) naming the
 * check: "short", "version", "op", "flags", "too-big", "length". The
 * payload points into b.
 */
struct vconn_frame {
	uint8_t op;
	uint16_t flags;
	uint32_t req, handle, arg;
	uint64_t arg2;
	const uint8_t *payload;
	uint32_t len;
};
VCONN_API int vconn_frame_decode(const uint8_t *b, size_t n, struct vconn_frame *f, const char **why);
/* Encodes f into out (VCONN_HEADER_LEN + f->len bytes): the length, or -EMSGSIZE. */
VCONN_API ssize_t vconn_frame_encode(const struct vconn_frame *f, uint8_t *out, size_t cap);
VCONN_API const char *vconn_op_name(uint8_t op);

struct vconn_hello_info {
	uint32_t quota, send_window, max_message;
	char node[254];
};
VCONN_API int vconn_hello_decode(const uint8_t *p, size_t n, struct vconn_hello_info *h);

struct vconn_shm_layout {
	uint32_t entries, slab, max_message;
};
VCONN_API int vconn_shm_layout_decode(const uint8_t *p, size_t n, struct vconn_shm_layout *l);
VCONN_API size_t vconn_shm_layout_size(const struct vconn_shm_layout *l);

#ifdef __cplusplus
}
#endif
#endif
