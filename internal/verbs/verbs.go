package verbs

// The interfaces below mirror libibverbs objects. Every method is safe for
// concurrent use unless it says otherwise; Close releases the object and
// fails with ErrBusy while objects created from it still exist, as
// ibv_dealloc_pd does with EBUSY.

// Device is an opened RDMA device (struct ibv_context) with one port.
type Device interface {
	Attr() DeviceAttr
	// GID returns entry index of the port's GID table.
	GID(index int) (GID, error)
	// PortState queries the port's state now (ibv_query_port's state):
	// a device whose link went down reports DOWN; one that disappeared
	// (hot-unplugged) fails with the error the query met. A closed device
	// fails with ErrClosed. It is a system call or more: call it to
	// watch the port, not on a hot path.
	PortState() (PortState, error)
	AllocPD() (PD, error)
	// CreateCQ creates a completion queue with room for at least cqe entries
	// and its own completion channel (see CQ.FD).
	CreateCQ(cqe int) (CQ, error)
	Close() error
}

// PD is a protection domain: MRs, QPs, SRQs and AHs created from one PD can
// only be used with each other.
type PD interface {
	// RegMR allocates length bytes outside the Go heap and registers them.
	RegMR(length int, access Access) (MR, error)
	// RegMRMem registers mem, memory the caller owns (ibv_reg_mr on its
	// address): the MR's Bytes is mem, and its Close deregisters mem
	// without unmapping it. mem lies outside the Go heap (a mapping:
	// AllocMemory's, a memfd's), at any byte alignment, and stays mapped
	// until Close returned. Empty mem, or remote write or atomic access
	// without local write, fails with ErrInvalid; memory not mapped
	// readable, or not writable for an access that writes
	// (Access.Writable), fails with ErrFault, as ibv_reg_mr fails with
	// EFAULT.
	RegMRMem(mem []byte, access Access) (MR, error)
	CreateQP(attr *QPInitAttr) (QP, error)
	CreateSRQ(attr *SRQInitAttr) (SRQ, error)
	CreateAH(attr *AHAttr) (AH, error)
	// AllocMW allocates a type 2 memory window (ibv_alloc_mw with
	// IBV_MW_TYPE_2), free until a WRBindMW binds it. A device without
	// type 2 windows (DeviceAttr.MaxMW 0) refuses with ErrInvalid.
	AllocMW() (MW, error)
	Close() error
}

// MR is a registered memory region. Close fails with ErrBusy while a
// memory window is bound to it (IBA 10.6.7.2.6). Its memory belongs to the
// verbs layer (RegMR) or to the caller (RegMRMem): Bytes is valid until
// Close (or, for the caller's, as long as the caller keeps it mapped), and
// the device may read or write it at any time a work request or a remote
// key allows until Close returned.
type MR interface {
	Bytes() []byte
	// Addr is the virtual address of Bytes()[0], the base for SGE.Addr and
	// remote addresses.
	Addr() uint64
	LKey() uint32
	RKey() uint32
	Close() error
}

// MW is a type 2 memory window: a remote key for a range of an MR, valid
// only on the QP it was bound on, from its bind until it is invalidated.
//
// A WRBindMW on an RC or UC QP binds it, in send queue order; a WRLocalInv
// on that QP, or Close, invalidates it, after which it can be bound again
// with a new key. A remote READ or WRITE through it on any other QP, with
// an old key, outside the bound range or without the access bound, fails
// with a remote access error (the kernel's rxe checks the range against
// the window's region only, not the window: bind windows over whole
// regions where that matters). Invalidate or close windows before closing
// the QP they are bound on: the kernel's rxe holds the QP while a window
// is bound to it (the soft provider invalidates them).
type MW interface {
	// Handle names the window in a WRBindMW work request (SendWR.MW).
	Handle() uint32
	// RKey is the window's key as allocated; a bind gives it new low 8
	// bits (SendWR.RKey), as ibv_inc_rkey does. Once a bind is posted,
	// RKey is the key that bind gives (as libibverbs keeps ibv_mw.rkey).
	RKey() uint32
	Close() error
}

// CQ is a completion queue and its completion channel.
type CQ interface {
	// Poll moves up to len(wcs) completions into wcs and returns how many.
	// It never blocks and never allocates.
	Poll(wcs []WC) int
	// ReqNotify arms the CQ: the next completion (only a solicited one, if
	// asked) makes FD readable. One arming, one event.
	ReqNotify(solicitedOnly bool) error
	// FD is the completion channel: a descriptor to wait on with poll(2) or
	// epoll when the CQ is idle.
	FD() int
	// AckEvents consumes the events pending on FD and returns how many there
	// were; it does not block.
	AckEvents() (int, error)
	Close() error
}

// Notifier is a CQ that can also deliver its completion events to a Go
// channel instead of FD, as a provider in the same process can: the waiting
// goroutine is then woken as one goroutine wakes another, with no system
// call and no trip through the runtime's network poller, which a busy P
// looks at only when it has nothing else to run.
type Notifier interface {
	// NotifyTo makes each event of a ReqNotify arming a send on ch that
	// does not block (a full ch already holds a wake-up), and FD stays
	// quiet. Call it before the first ReqNotify.
	NotifyTo(ch chan<- struct{})
}

// QP is a queue pair.
type QP interface {
	QPN() uint32
	Type() QPType
	State() QPState
	// Modify moves the QP through RESET→INIT→RTR→RTS (or to ERR/RESET),
	// reading the attributes mask names. A transition or attribute set that
	// libibverbs would refuse fails with ErrInvalid.
	Modify(attr *QPAttr, mask QPAttrMask) error
	Query() QPAttr
	// PostSend posts a batch of work requests with one doorbell. It returns
	// how many were accepted; on error wrs[n] is the one that failed and none
	// after it was posted (ibv_post_send's bad_wr).
	PostSend(wrs []SendWR) (int, error)
	// PostRecv posts receive work requests; same contract as PostSend. A QP
	// created with an SRQ refuses it.
	PostRecv(wrs []RecvWR) (int, error)
	Close() error
}

// SRQ is a shared receive queue: receives posted here serve every QP
// created with it.
type SRQ interface {
	PostRecv(wrs []RecvWR) (int, error)
	Close() error
}

// AH is an address handle for UD sends; SendWR.AH carries its Handle.
type AH interface {
	Handle() uint32
	Close() error
}
