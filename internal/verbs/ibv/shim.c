//go:build ibverbs && linux

#include <errno.h>
#include <string.h>
#include <arpa/inet.h>
#include "shim.h"

enum {
	RV_SIZE_SGE, RV_SIZE_SEND, RV_SIZE_RECV, RV_SIZE_WC,
	RV_OFF_SEND_NUMSGE, RV_OFF_SEND_FLAGS, RV_OFF_SEND_IMM, RV_OFF_SEND_RADDR, RV_OFF_SEND_QKEY,
	RV_OFF_RECV_NUMSGE, RV_OFF_WC_VENDOR, RV_OFF_WC_SRCQP, RV_OFF_WC_PKEY,
	RV_OFF_SEND_MW, RV_OFF_WC_SLID,
};

size_t rv_layout(int what)
{
	switch (what) {
	case RV_SIZE_SGE: return sizeof(struct rv_sge);
	case RV_SIZE_SEND: return sizeof(struct rv_send_wr);
	case RV_SIZE_RECV: return sizeof(struct rv_recv_wr);
	case RV_SIZE_WC: return sizeof(struct rv_wc);
	case RV_OFF_SEND_NUMSGE: return offsetof(struct rv_send_wr, num_sge);
	case RV_OFF_SEND_FLAGS: return offsetof(struct rv_send_wr, flags);
	case RV_OFF_SEND_IMM: return offsetof(struct rv_send_wr, imm_data);
	case RV_OFF_SEND_RADDR: return offsetof(struct rv_send_wr, remote_addr);
	case RV_OFF_SEND_QKEY: return offsetof(struct rv_send_wr, remote_qkey);
	case RV_OFF_RECV_NUMSGE: return offsetof(struct rv_recv_wr, num_sge);
	case RV_OFF_WC_VENDOR: return offsetof(struct rv_wc, vendor_err);
	case RV_OFF_WC_SRCQP: return offsetof(struct rv_wc, src_qp);
	case RV_OFF_WC_PKEY: return offsetof(struct rv_wc, pkey_index);
	case RV_OFF_SEND_MW: return offsetof(struct rv_send_wr, mw);
	case RV_OFF_WC_SLID: return offsetof(struct rv_wc, slid);
	}
	return 0;
}

int rv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	return ibv_query_port(ctx, port, attr);
}

struct ibv_mw *rv_alloc_mw(struct ibv_pd *pd)
{
	return ibv_alloc_mw(pd, IBV_MW_TYPE_2);
}

int rv_dealloc_mw(struct ibv_mw *mw)
{
	return ibv_dealloc_mw(mw);
}

// The chain is built on the C stack in chunks: no allocation, and no state
// shared between threads posting to the same QP (libibverbs allows that).
#define RV_CHUNK 64

// copy_sges copies n (at most RV_MAX_SGE) SGEs into dst and returns it.
static struct ibv_sge *copy_sges(struct ibv_sge *dst, const struct rv_sge *src, int n)
{
	for (int i = 0; i < n; i++) {
		dst[i].addr = src[i].addr;
		dst[i].length = src[i].length;
		dst[i].lkey = src[i].lkey;
	}
	return dst;
}

// check_send guards only what would make this file read out of bounds or
// through NULL: the Go side has checked every WR before (verbs.CheckSendWR,
// the address handles, the binds' windows and regions) and posts only the
// WRs that passed.
static int check_send(uint32_t type, const struct rv_send_wr *w, struct ibv_ah **ahs, uint32_t nah,
		      const struct rv_bind *bind)
{
	if (w->num_sge > RV_MAX_SGE)
		return EINVAL;
	switch (w->opcode) {
	case IBV_WR_BIND_MW:
		return bind == NULL || bind->mw == NULL || bind->mr == NULL ? EINVAL : 0;
	case IBV_WR_LOCAL_INV:
		return 0;
	}
	if (type == IBV_QPT_UD && (w->ah == 0 || w->ah > nah || ahs[w->ah - 1] == NULL))
		return EINVAL;
	return 0;
}

#define RV_RESULT(posted, err) (((int64_t)(err) << 32) | (int64_t)(uint32_t)(posted))

int64_t rv_post_send(struct ibv_qp *qp, uint32_t type, struct ibv_ah **ahs, uint32_t nah,
		     const struct rv_bind *binds, const struct rv_send_wr *wrs, int n)
{
	struct ibv_send_wr chain[RV_CHUNK];
	struct ibv_sge sges[RV_CHUNK * RV_MAX_SGE];
	for (int base = 0; base < n; base += RV_CHUNK) {
		int m = n - base < RV_CHUNK ? n - base : RV_CHUNK;
		int err = 0, k;
		for (k = 0; k < m; k++) {
			const struct rv_send_wr *w = &wrs[base + k];
			const struct rv_bind *bind = binds ? &binds[base + k] : NULL;
			if ((err = check_send(type, w, ahs, nah, bind)) != 0)
				break;
			struct ibv_send_wr *c = &chain[k];
			memset(c, 0, sizeof(*c));
			c->wr_id = w->wr_id;
			c->next = &chain[k + 1];
			c->sg_list = copy_sges(&sges[k * RV_MAX_SGE], w->sg, w->num_sge);
			c->num_sge = w->num_sge;
			c->opcode = (enum ibv_wr_opcode)w->opcode;
			c->send_flags = w->flags;
			c->imm_data = htonl(w->imm_data);
			if (w->opcode == IBV_WR_BIND_MW) {
				// The region and range go in bind_info, not the SGE list.
				c->sg_list = NULL;
				c->num_sge = 0;
				c->bind_mw.mw = bind->mw;
				c->bind_mw.rkey = w->rkey;
				c->bind_mw.bind_info.mr = bind->mr;
				c->bind_mw.bind_info.addr = w->sg[0].addr;
				c->bind_mw.bind_info.length = w->sg[0].length;
				c->bind_mw.bind_info.mw_access_flags = w->mw_access;
			} else if (w->opcode == IBV_WR_LOCAL_INV) {
				c->sg_list = NULL;
				c->num_sge = 0;
				c->invalidate_rkey = w->rkey; // shares a union with imm_data
			} else if (type == IBV_QPT_UD) {
				c->wr.ud.ah = ahs[w->ah - 1];
				c->wr.ud.remote_qpn = w->remote_qpn;
				c->wr.ud.remote_qkey = w->remote_qkey;
			} else {
				c->wr.rdma.remote_addr = w->remote_addr;
				c->wr.rdma.rkey = w->rkey;
			}
		}
		if (k > 0) {
			struct ibv_send_wr *badwr = NULL;
			chain[k - 1].next = NULL;
			int rc = ibv_post_send(qp, chain, &badwr);
			int posted = rc != 0 ? (badwr ? (int)(badwr - chain) : 0) : k;
			// libibverbs leaves a type 2 window's rkey to the caller:
			// the provider (rxe) names the window by it in the next bind.
			for (int i = 0; binds && i < posted; i++)
				if (chain[i].opcode == IBV_WR_BIND_MW)
					chain[i].bind_mw.mw->rkey = chain[i].bind_mw.rkey;
			if (rc != 0)
				return RV_RESULT(base + posted, rc);
		}
		if (err != 0)
			return RV_RESULT(base + k, err);
	}
	return RV_RESULT(n, 0);
}

int64_t rv_post_recv(struct ibv_qp *qp, struct ibv_srq *srq, uint32_t max_sge, const struct rv_recv_wr *wrs, int n)
{
	struct ibv_recv_wr chain[RV_CHUNK];
	struct ibv_sge sges[RV_CHUNK * RV_MAX_SGE];
	for (int base = 0; base < n; base += RV_CHUNK) {
		int m = n - base < RV_CHUNK ? n - base : RV_CHUNK;
		int err = 0, k;
		for (k = 0; k < m; k++) {
			const struct rv_recv_wr *w = &wrs[base + k];
			if (w->num_sge > RV_MAX_SGE || w->num_sge > max_sge) {
				err = EINVAL;
				break;
			}
			struct ibv_recv_wr *c = &chain[k];
			c->wr_id = w->wr_id;
			c->next = &chain[k + 1];
			c->sg_list = copy_sges(&sges[k * RV_MAX_SGE], w->sg, w->num_sge);
			c->num_sge = w->num_sge;
		}
		if (k > 0) {
			struct ibv_recv_wr *badwr = NULL;
			chain[k - 1].next = NULL;
			int rc = srq ? ibv_post_srq_recv(srq, chain, &badwr) : ibv_post_recv(qp, chain, &badwr);
			if (rc != 0)
				return RV_RESULT(base + (badwr ? (int)(badwr - chain) : 0), rc);
		}
		if (err != 0)
			return RV_RESULT(base + k, err);
	}
	return RV_RESULT(n, 0);
}

int rv_reenter_err(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_ERR;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

int rv_poll(struct ibv_cq *cq, struct rv_wc *out, int n)
{
	struct ibv_wc wc[RV_CHUNK];
	int got = 0;
	while (got < n) {
		int want = n - got < RV_CHUNK ? n - got : RV_CHUNK;
		int k = ibv_poll_cq(cq, want, wc);
		if (k < 0)
			return got > 0 ? got : -1;
		for (int i = 0; i < k; i++) {
			struct rv_wc *o = &out[got + i];
			o->wr_id = wc[i].wr_id;
			o->status = (uint8_t)wc[i].status;
			o->opcode = (uint8_t)wc[i].opcode;
			// wc_flags and imm_data are defined for receive completions
			// only; rxe flags a requester's SEND/WRITE_WITH_IMM completion
			// WITH_IMM too, other providers do not.
			int recv = (wc[i].opcode & IBV_WC_RECV) != 0;
			o->flags = recv ? (uint8_t)(wc[i].wc_flags & (IBV_WC_GRH | IBV_WC_WITH_IMM)) : 0;
			o->vendor_err = wc[i].vendor_err;
			o->byte_len = wc[i].byte_len;
			o->imm_data = recv && (wc[i].wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc[i].imm_data) : 0;
			o->qp_num = wc[i].qp_num;
			o->src_qp = wc[i].src_qp;
			o->pkey_index = wc[i].pkey_index;
			o->slid = wc[i].slid;
		}
		got += k;
		if (k < want)
			break;
	}
	return got;
}

int rv_ack_events(struct ibv_comp_channel *ch, struct ibv_cq *cq)
{
	int n = 0;
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	while (ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0)
		n++;
	if (n > 0)
		ibv_ack_cq_events(cq, (unsigned int)n);
	return n;
}
