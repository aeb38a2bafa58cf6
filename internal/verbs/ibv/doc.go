// Package ibv is the libibverbs backend of package verbs: RDMA hardware (and
// the kernel's soft-RoCE, rdma_rxe) driven through cgo. It is built only
// with the build tag ibverbs (and on Linux); without it the package is
// empty, so a build needs no RDMA headers or libraries.
//
// Open selects a device by name, node GUID or vendor and one of its GIDs.
// The verbs.Device it returns shows the port's GID table with the selected
// entry at index 0 (it and the entry at the selected index trade places),
// because the layers above address a device by GID index 0; AHAttr.SGIDIndex
// and Query translate the same way. On an InfiniBand port, DeviceAttr has
// the port's LID and LMC, an AHAttr with NoGRH is routed by DLID, and a
// completion carries the sender's LID (WC.SLID); that path is untested on
// InfiniBand hardware.
//
// Work requests and completions cross cgo once per PostSend, PostRecv and
// Poll: a C helper builds the ibv_send_wr/ibv_recv_wr chain from the flat Go
// structs, or converts a batch of ibv_wc, on the C stack. Every send WR is
// checked in Go before it reaches the provider (the QP state,
// verbs.CheckSendWR with the active MTU for UD, then its address handle or
// a bind's window and region), and only the WRs before the first refused
// one are posted: a refused WR is reported, with why, the same way
// whatever the provider would do later.
//
// Memory of an MR is mmap'd outside the Go heap (verbs.AllocMemory) and then
// registered with ibv_reg_mr.
package ibv
