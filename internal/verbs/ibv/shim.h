// C side of package ibv: mirrors of the flat verbs structs and the helpers
// that turn one Go batch into one libibverbs call.
#ifndef RDMAVISOR_IBV_SHIM_H
#define RDMAVISOR_IBV_SHIM_H

#include <stddef.h>
#include <stdint.h>
#include <infiniband/verbs.h>

#define RV_MAX_SGE 4

// Layouts of verbs.SGE, verbs.SendWR, verbs.RecvWR and verbs.WC; checked
// against the Go structs when the package starts (layout.go).
struct rv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};

struct rv_send_wr {
	uint64_t wr_id;
	struct rv_sge sg[RV_MAX_SGE];
	uint8_t num_sge;
	uint8_t opcode;
	uint32_t flags;
	uint32_t imm_data; // host order
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t ah;
	uint32_t remote_qpn;
	uint32_t remote_qkey;
	uint32_t mw;        // WRBindMW: the window's handle (resolved in Go)
	uint32_t mw_access; // WRBindMW: mw_access_flags
};

// rv_bind is what a WRBindMW names, resolved from its handle and lkey by
// the Go side: the provider wants pointers.
struct rv_bind {
	struct ibv_mw *mw;
	struct ibv_mr *mr;
};

struct rv_recv_wr {
	uint64_t wr_id;
	struct rv_sge sg[RV_MAX_SGE];
	uint8_t num_sge;
};

struct rv_wc {
	uint64_t wr_id;
	uint8_t status;
	uint8_t opcode;
	uint8_t flags;
	uint32_t vendor_err;
	uint32_t byte_len;
	uint32_t imm_data; // host order
	uint32_t qp_num;
	uint32_t src_qp;
	uint16_t pkey_index;
	uint16_t slid;
};

size_t rv_layout(int what);
// rv_query_port calls ibv_query_port, a macro cgo cannot call.
int rv_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr);

// rv_post_send posts n WRs to a QP of the given type (enum ibv_qp_type),
// which the Go side has checked (verbs.CheckSendWR). It returns how many were posted in the low 32
// bits and the errno that stopped it (0: none) in the high 32 bits, so Go
// passes no pointer to a result (which would escape and allocate). binds,
// when not NULL, has n entries: the window and region of each WRBindMW
// (NULL where unknown: the WR is refused). A posted bind sets the window's
// ibv_mw.rkey to the new key, which the provider reads as the window's
// current key in the next bind.
int64_t rv_post_send(struct ibv_qp *qp, uint32_t type, struct ibv_ah **ahs, uint32_t nah,
		     const struct rv_bind *binds, const struct rv_send_wr *wrs, int n);
// rv_alloc_mw and rv_dealloc_mw wrap the static inline libibverbs calls.
struct ibv_mw *rv_alloc_mw(struct ibv_pd *pd);
int rv_dealloc_mw(struct ibv_mw *mw);
// rv_post_recv posts n receives to qp, or to srq when it is not NULL; the
// result is rv_post_send's.
int64_t rv_post_recv(struct ibv_qp *qp, struct ibv_srq *srq, uint32_t max_sge, const struct rv_recv_wr *wrs, int n);
// rv_reenter_err moves a QP in ERR to ERR again (see qp.PostRecv).
int rv_reenter_err(struct ibv_qp *qp);
// rv_poll moves up to n completions into out; returns how many, or -1.
int rv_poll(struct ibv_cq *cq, struct rv_wc *out, int n);
// rv_ack_events consumes the events pending on a non-blocking channel.
int rv_ack_events(struct ibv_comp_channel *ch, struct ibv_cq *cq);

#endif
