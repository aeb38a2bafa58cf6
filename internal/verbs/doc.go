// Package verbs is the RDMA verbs boundary of RDMAvisor: Go interfaces that
// mirror libibverbs (Device, PD, MR, CQ, QP, SRQ, AH) and the flat types that
// cross it.
//
// Work requests and completions are plain structs with no Go pointers, so a
// batch can cross cgo in one call, and they are passed in caller-owned slices:
// PostSend and PostRecv take a batch, CQ.Poll fills the caller's slice. Enums
// and status codes keep libibverbs' numbering so a value read in a log means
// the same thing as in ibv_wc_status_str.
//
// Memory that a device may touch (MR memory) is allocated by the verbs layer
// outside the Go heap (mmap), never a Go slice handed to hardware: the garbage
// collector may move or free Go memory while a device still reads it.
//
// Backends: soft (pure Go, RoCEv2 over UDP or an in-memory fabric) and, behind
// the ibverbs build tag, libibverbs. Both are checked by package verbstest.
// Both run this package's checks (CheckQPInitAttr, CheckQPAttr,
// CheckSendWR) before their own, as the kernel's ib_core checks a call
// before the provider does, so an argument wrong on every device is
// refused the same way, with the same reason, on each.
package verbs
