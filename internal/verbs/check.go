package verbs

import "fmt"

// The checks every backend runs before its own, as the kernel's ib_core
// checks a call before the provider (rxe) does: what is wrong whatever the
// device. A backend then checks what depends on it (ports, handles, the
// keys of its PD) and on the QP's state. Each refusal wraps ErrInvalid
// (EINVAL) and says what was wrong.

// CheckQPInitAttr checks a QP's creation attributes: a type RC, UC or UD,
// and both CQs given.
func CheckQPInitAttr(a *QPInitAttr) error {
	switch {
	case a == nil:
		return fmt.Errorf("%w: no attributes", ErrInvalid)
	case a.Type != QPTypeRC && a.Type != QPTypeUC && a.Type != QPTypeUD:
		return fmt.Errorf("%w: type %d is not RC, UC or UD", ErrInvalid, uint8(a.Type))
	case a.SendCQ == nil:
		return fmt.Errorf("%w: no send CQ", ErrInvalid)
	case a.RecvCQ == nil:
		return fmt.Errorf("%w: no receive CQ", ErrInvalid)
	}
	return nil
}

// Widths of the IB fields QPAttr's numbers go into.
const (
	maxPSN     = 1<<24 - 1 // PSNs and QPNs: 24 bits
	maxRetry   = 7         // retry counts: 3 bits
	maxTimer   = 31        // timeout and RNR timer: 5 bits
	maxQPState = QPStateErr
)

// CheckQPAttr checks the fields of a that mask names against their IB
// widths: a QP state, a path MTU enum 1 (256) to 5 (4096), retry counts up
// to 7, timers up to 31, PSNs and the destination QPN in 24 bits. rxe
// (Linux 6.1) would take some of them and truncate them. Whether the
// transition is allowed, and with which attributes, depends on the QP's
// state and is the backend's to check.
func CheckQPAttr(a *QPAttr, mask QPAttrMask) error {
	if a == nil {
		return fmt.Errorf("%w: no attributes", ErrInvalid)
	}
	bad := func(name string, v, hi uint32) error {
		return fmt.Errorf("%w: %s %d out of range 0..%d", ErrInvalid, name, v, hi)
	}
	switch {
	case mask&QPAttrState != 0 && a.State > maxQPState:
		return bad("state", uint32(a.State), uint32(maxQPState))
	case mask&QPAttrCurState != 0 && a.CurState > maxQPState:
		return bad("current state", uint32(a.CurState), uint32(maxQPState))
	case mask&QPAttrPathMTU != 0 && a.PathMTU.Bytes() == 0:
		return fmt.Errorf("%w: path MTU enum %d: want 1 (256) .. 5 (4096)", ErrInvalid, uint8(a.PathMTU))
	case mask&QPAttrRetryCnt != 0 && a.RetryCnt > maxRetry:
		return bad("retry count", uint32(a.RetryCnt), maxRetry)
	case mask&QPAttrRNRRetry != 0 && a.RNRRetry > maxRetry:
		return bad("RNR retry", uint32(a.RNRRetry), maxRetry)
	case mask&QPAttrTimeout != 0 && a.Timeout > maxTimer:
		return bad("timeout", uint32(a.Timeout), maxTimer)
	case mask&QPAttrMinRNRTimer != 0 && a.MinRNRTimer > maxTimer:
		return bad("min RNR timer", uint32(a.MinRNRTimer), maxTimer)
	case mask&QPAttrRQPSN != 0 && a.RQPSN > maxPSN:
		return bad("RQ PSN", a.RQPSN, maxPSN)
	case mask&QPAttrSQPSN != 0 && a.SQPSN > maxPSN:
		return bad("SQ PSN", a.SQPSN, maxPSN)
	case mask&QPAttrDestQPN != 0 && a.DestQPN > maxPSN:
		return bad("destination QPN", a.DestQPN, maxPSN)
	case mask&QPAttrAV != 0:
		if err := CheckAH(&a.AH); err != nil {
			return fmt.Errorf("address vector: %w", err)
		}
	}
	return nil
}

// CheckAH checks an address vector's fields against their IB widths: a
// service level in 4 bits, and, without a GRH, a unicast DLID (1 ..
// MaxUnicastLID) and source path bits in 7 (an LMC is at most 7).
func CheckAH(a *AHAttr) error {
	switch {
	case a == nil:
		return fmt.Errorf("%w: no address vector", ErrInvalid)
	case a.SL > 15:
		return fmt.Errorf("%w: service level %d out of range 0..15", ErrInvalid, a.SL)
	case !a.NoGRH:
		return nil
	case a.DLID == 0 || a.DLID > MaxUnicastLID:
		return fmt.Errorf("%w: DLID %#x is not a unicast LID (1..%#x): is the port's subnet manager running?", ErrInvalid, a.DLID, MaxUnicastLID)
	case a.SrcPathBits > 0x7f:
		return fmt.Errorf("%w: source path bits %#x out of range 0..0x7f", ErrInvalid, a.SrcPathBits)
	}
	return nil
}

// SendLimits is what CheckSendWR checks a send WR against: the QP's type
// and what it was created with.
type SendLimits struct {
	Type      QPType
	MaxSGE    uint32 // the QP's MaxSendSGE
	MaxInline uint32 // the QP's MaxInlineData
	// MTU is the longest UD message, in bytes: the path MTU, or the
	// port's.
	MTU uint32
}

// CheckSendWR checks one send WR as every provider must before queueing
// it: its SGE count, an opcode the QP's type allows (RDMA writes not on
// UD, reads on RC only, binds and invalidates not on UD, no atomics), no
// inline read, bind or invalidate, inline data within MaxInline, a bind
// with one SGE and only remote access bits (and zero-based), a UD message
// within the MTU. Binds and invalidates carry no message, so the length
// checks skip them. A backend then checks the handles and keys the WR
// names (its address handle, window and region), which are its own.
//
// It allocates nothing unless it refuses: PostSend calls it on every WR.
func CheckSendWR(wr *SendWR, lim *SendLimits) error {
	if wr.NumSGE > MaxSGE || uint32(wr.NumSGE) > lim.MaxSGE {
		return fmt.Errorf("%w: %d SGEs, the QP takes %d", ErrInvalid, wr.NumSGE, lim.MaxSGE)
	}
	inline := wr.Flags&SendInline != 0
	switch wr.Opcode {
	case WRSend, WRSendWithImm:
	case WRRDMAWrite, WRRDMAWriteWithImm:
		if lim.Type == QPTypeUD {
			return fmt.Errorf("%w: %v on a UD QP", ErrInvalid, wr.Opcode)
		}
	case WRRDMARead:
		if lim.Type != QPTypeRC {
			return fmt.Errorf("%w: %v on a %v QP", ErrInvalid, wr.Opcode, lim.Type)
		}
		if inline {
			return fmt.Errorf("%w: inline %v", ErrInvalid, wr.Opcode)
		}
	case WRBindMW, WRLocalInv:
		return checkLocalOp(wr, lim.Type)
	default:
		return fmt.Errorf("%w: opcode %v", ErrInvalid, wr.Opcode)
	}
	n := wr.Len()
	if inline && n > uint64(lim.MaxInline) {
		return fmt.Errorf("%w: %d bytes of inline data, the QP takes %d", ErrInvalid, n, lim.MaxInline)
	}
	if lim.Type == QPTypeUD && n > uint64(lim.MTU) {
		return fmt.Errorf("%w: UD message of %d bytes exceeds the %d-byte MTU", ErrInvalid, n, lim.MTU)
	}
	return nil
}

// mwAccess is what a bind may grant.
const mwAccess = AccessRemoteRead | AccessRemoteWrite | AccessRemoteAtomic | AccessZeroBased

// checkLocalOp is CheckSendWR for a bind or an invalidate.
func checkLocalOp(wr *SendWR, t QPType) error {
	switch {
	case t == QPTypeUD:
		return fmt.Errorf("%w: %v on a UD QP", ErrInvalid, wr.Opcode)
	case wr.Flags&SendInline != 0:
		return fmt.Errorf("%w: inline %v", ErrInvalid, wr.Opcode)
	case wr.Opcode == WRLocalInv:
		return nil
	case wr.NumSGE != 1:
		return fmt.Errorf("%w: a bind takes one SGE, not %d", ErrInvalid, wr.NumSGE)
	case wr.MWAccess&^mwAccess != 0:
		return fmt.Errorf("%w: window access %#x", ErrInvalid, uint32(wr.MWAccess))
	}
	return nil
}
