package verbs

// MaxSGE is the number of scatter/gather entries a work request carries
// inline. Work requests are flat (no Go pointers) so the list is an array.
const MaxSGE = 4

// GRHSize is the space a UD receive buffer reserves at its head for the
// Global Routing Header, whether or not the packet carried one.
const GRHSize = 40

// SGE is struct ibv_sge: Addr is a virtual address inside the memory region
// whose key is LKey.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is struct ibv_send_wr without its pointers: the list is an array,
// the UD address handle a number (AH.Handle), a memory window its Handle.
//
// A WRBindMW binds window MW to SG[0] (Addr and Length inside the MR whose
// LKey is SG[0].LKey; NumSGE 1) with access MWAccess and gives it key RKey:
// the window's key, MW.RKey, with new low 8 bits (they must differ from
// the current key's; the kernel's rxe and the soft provider do not check).
// A WRLocalInv invalidates the window whose current
// key is RKey. Both are refused at post on UD QPs, and a bind naming a
// window or an lkey that is not this QP's PD's is refused at post; both
// complete (if signaled) with WCBindMW or WCLocalInv, or WCMWBindErr (bind)
// / WCLocQPOpErr (invalidate) when the device refuses to execute them, and
// the QP goes to ERR.
type SendWR struct {
	WRID   uint64
	SG     [MaxSGE]SGE
	NumSGE uint8
	Opcode WROpcode
	Flags  SendFlags
	// ImmData is in host order here; providers put it on the wire big-endian.
	ImmData uint32
	// RDMA operations.
	RemoteAddr uint64
	RKey       uint32
	// UD operations.
	AH         uint32
	RemoteQPN  uint32
	RemoteQKey uint32
	// WRBindMW: the window (MW.Handle) and what the bind grants:
	// AccessRemoteRead, AccessRemoteWrite, AccessRemoteAtomic, optionally
	// AccessZeroBased.
	MW       uint32
	MWAccess Access
}

// Len returns the total length of the work request's scatter/gather list.
func (w *SendWR) Len() uint64 {
	var n uint64
	for i := 0; i < int(w.NumSGE) && i < MaxSGE; i++ {
		n += uint64(w.SG[i].Length)
	}
	return n
}

// RecvWR is struct ibv_recv_wr without its pointers.
type RecvWR struct {
	WRID   uint64
	SG     [MaxSGE]SGE
	NumSGE uint8
}

// Len returns the total length of the work request's scatter/gather list.
func (w *RecvWR) Len() uint64 {
	var n uint64
	for i := 0; i < int(w.NumSGE) && i < MaxSGE; i++ {
		n += uint64(w.SG[i].Length)
	}
	return n
}

// WC is struct ibv_wc. ImmData is in host order.
type WC struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	Flags     WCFlags
	VendorErr uint32
	ByteLen   uint32
	ImmData   uint32
	QPN       uint32
	SrcQP     uint32
	PKeyIndex uint16
	// SLID is the sender's LID on an InfiniBand port (0 on RoCE): what
	// names a UD sender whose datagram came without a GRH.
	SLID uint16
}
