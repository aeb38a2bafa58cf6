/* The pod protocol's codec: frames, Hello info, shared-memory layouts
 * (docs/protocol.md §2, §3, §5), and the error codes. Nothing here trusts
 * its input: every length is checked before it is used. */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <string.h>

static uint16_t get16(const uint8_t *p) { return (uint16_t)((unsigned)p[0] << 8 | p[1]); }
uint32_t vc_get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static uint64_t get64(const uint8_t *p) { return (uint64_t)vc_get32(p) << 32 | vc_get32(p + 4); }
void vc_put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static const char *const op_names[VC_OP_LIMIT] = {
	NULL, "hello", "listen", "dial", "send", "grant", "close", "export", "unexport",
	"local-read", "local-write", "write", "read", "ok", "error", "data", "eof", "accept", "shm", "stage",
};

const char *vconn_op_name(uint8_t op)
{
	if (op > 0 && op < VC_OP_LIMIT)
		return op_names[op];
	return "unknown";
}

int vconn_frame_decode(const uint8_t *b, size_t n, struct vconn_frame *f, const char **why)
{
	const char *w = NULL;
	uint32_t len = 0;
	if (n < VCONN_HEADER_LEN)
		w = "short";
	else if (b[0] != VC_VERSION)
		w = "version";
	else if (b[1] == 0 || b[1] >= VC_OP_LIMIT)
		w = "op";
	else if (get16(b + 2) & ~(VC_FLAG_IMM | VC_FLAG_BRIDGE | VC_FLAG_MEMFD))
		w = "flags";
	else if ((len = vc_get32(b + 24)) > VCONN_MAX_PAYLOAD)
		w = "too-big";
	else if ((size_t)len != n - VCONN_HEADER_LEN)
		w = "length";
	if (w) {
		if (why)
			*why = w;
		return -EPROTO;
	}
	f->op = b[1];
	f->flags = get16(b + 2);
	f->req = vc_get32(b + 4);
	f->handle = vc_get32(b + 8);
	f->arg = vc_get32(b + 12);
	f->arg2 = get64(b + 16);
	f->len = len;
	f->payload = b + VCONN_HEADER_LEN;
	return 0;
}

ssize_t vconn_frame_encode(const struct vconn_frame *f, uint8_t *out, size_t cap)
{
	if (f->len > VCONN_MAX_PAYLOAD || cap < VCONN_HEADER_LEN + (size_t)f->len)
		return -EMSGSIZE;
	out[0] = VC_VERSION;
	out[1] = f->op;
	out[2] = (uint8_t)(f->flags >> 8);
	out[3] = (uint8_t)f->flags;
	vc_put32(out + 4, f->req);
	vc_put32(out + 8, f->handle);
	vc_put32(out + 12, f->arg);
	vc_put32(out + 16, (uint32_t)(f->arg2 >> 32));
	vc_put32(out + 20, (uint32_t)f->arg2);
	vc_put32(out + 24, f->len);
	if (f->len)
		memcpy(out + VCONN_HEADER_LEN, f->payload, f->len);
	return VCONN_HEADER_LEN + (ssize_t)f->len;
}

int vconn_hello_decode(const uint8_t *p, size_t n, struct vconn_hello_info *h)
{
	if (n < 12 || n > 12 + 253)
		return -EPROTO;
	h->quota = vc_get32(p);
	h->send_window = vc_get32(p + 4);
	h->max_message = vc_get32(p + 8);
	memcpy(h->node, p + 12, n - 12);
	h->node[n - 12] = 0;
	return 0;
}

int vconn_shm_layout_decode(const uint8_t *p, size_t n, struct vconn_shm_layout *l)
{
	if (n != 12)
		return -EPROTO;
	l->entries = vc_get32(p);
	l->slab = vc_get32(p + 4);
	l->max_message = vc_get32(p + 8);
	if (l->entries < 2 || l->entries > (1u << 16) || (l->entries & (l->entries - 1)))
		return -EPROTO;
	if (l->slab < 64 || l->slab > (1u << 28) || l->slab % 64)
		return -EPROTO;
	if (l->max_message == 0 || l->max_message > l->slab / 2)
		return -EPROTO;
	return 0;
}

size_t vc_ring_len(const struct vconn_shm_layout *l)
{
	size_t n = VC_RING_HEADER + (size_t)l->entries * VC_DESC_LEN + l->slab;
	return (n + 4095) & ~(size_t)4095;
}

size_t vconn_shm_layout_size(const struct vconn_shm_layout *l) { return 2 * vc_ring_len(l); }

int vconn_code_errno(uint32_t code)
{
	switch (code) {
	case 1: return -EINVAL;
	case 2: return -EPROTONOSUPPORT;
	case 3: return -EDQUOT;
	case 4: return -EBADF;
	case 5: return -ECONNREFUSED;
	case 6: return -EHOSTUNREACH;
	case 7: return -EPIPE;
	case 8: return -ECONNRESET;
	case 9: return -EHOSTDOWN;
	case 10: return -EMSGSIZE;
	case 11: return -EIO;
	case 12: return -EADDRINUSE;
	case 13: return -EACCES;
	case 14: return -ENOBUFS;
	case 15: return -ESHUTDOWN;
	case 16: return -ENOSPC;
	case 17: return -EADDRNOTAVAIL;
	case 18: return -ENXIO;
	}
	return -EREMOTEIO;
}

const char *vconn_strerror(int err)
{
	switch (err) {
	case 0: return "success";
	case -EINVAL: return "bad request";
	case -EPROTONOSUPPORT: return "protocol version not supported by the agent";
	case -EDQUOT: return "vconn quota exhausted";
	case -EBADF: return "no such handle";
	case -ECONNREFUSED: return "connection refused: nothing listens there";
	case -EHOSTUNREACH: return "no node serves the address";
	case -EPIPE: return "vconn closed";
	case -ECONNRESET: return "vconn reset by peer";
	case -EHOSTDOWN: return "peer node gone";
	case -EMSGSIZE: return "message too large";
	case -EIO: return "agent internal error";
	case -EADDRINUSE: return "address in use";
	case -EACCES: return "region missing, out of bounds or not allowed";
	case -ENOBUFS: return "send window exceeded";
	case -ESHUTDOWN: return "agent shutting down";
	case -ENOSPC: return "allocation limit reached";
	case -EADDRNOTAVAIL: return "the allocation's pod has no address yet";
	case -ENXIO: return "unknown host";
	case -EREMOTEIO: return "the agent reported an unknown error code";
	case -ENOTCONN: return "connection to the agent lost";
	case -EPROTO: return "protocol error: the agent broke the protocol";
	case -EPROTOTYPE: return "not a byte stream: the transport may lose messages";
	case -ENODATA: return "end of stream: the peer closed";
	case -ETIMEDOUT: return "timed out";
	case -EAGAIN: return "would block";
	case -ENOMEM: return "out of memory";
	case -ENOENT: return "RDMAVISOR_SOCKET is not set, or the socket does not exist";
	}
	return err < 0 ? strerror(-err) : "not an error value";
}
