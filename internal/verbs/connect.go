package verbs

import "fmt"

// Remote is what one side of a connected QP must learn about the other,
// exchanged out of band (the agents' control plane does it).
type Remote struct {
	GID GID
	QPN uint32
	PSN uint32 // the peer's starting send PSN: our expected receive PSN
	// LID is the peer port's base LID, which an InfiniBand path routes
	// on (unused on RoCE).
	LID uint16
}

// MaxUnicastLID is the highest unicast LID (IBA 4.1.3: 0xC000 and up are
// multicast, 0xFFFF the permissive LID, 0 reserved).
const MaxUnicastLID = 0xBFFF

// AddressVector returns the address vector that reaches remote from a
// port of link layer ll. On InfiniBand it is a path within the subnet, as
// a path record gives it: no GRH, DLID the peer's LID, service level sl
// and source path bits bits. Nothing asks the subnet administrator for
// path records: the LIDs come from the peers themselves (the control
// plane), so a path across IB routers (which needs a GRH) is not built.
// On any other link layer it is RoCE's: a GRH to the peer's GID (hop
// limit 64). Untested on InfiniBand hardware.
func AddressVector(ll LinkLayer, remote Remote, sl, bits uint8) (AHAttr, error) {
	if ll != LinkLayerInfiniBand {
		return AHAttr{DGID: remote.GID, PortNum: 1, HopLimit: 64, SL: sl}, nil
	}
	av := AHAttr{NoGRH: true, DLID: remote.LID, SL: sl, SrcPathBits: bits, PortNum: 1}
	if err := CheckAH(&av); err != nil {
		return AHAttr{}, fmt.Errorf("verbs: InfiniBand path to %v: %w", remote.GID, err)
	}
	return av, nil
}

// PathOptions are the connection attributes of ConnectQP. Zero values take
// the defaults noted.
type PathOptions struct {
	MTU         MTU    // default MTU1024
	Access      Access // remote access the QP allows (RC/UC)
	Timeout     uint8  // local ACK timeout, 4.096 µs × 2^Timeout (default 14 ≈ 67 ms)
	RetryCnt    uint8  // default 7
	RNRRetry    uint8  // default 7 (forever)
	MinRNRTimer uint8  // default 12 (0.64 ms)
	MaxRdAtomic uint8  // outstanding reads, both directions (default 16)
	SQPSN       uint32 // our starting send PSN
	// LinkLayer is the local port's (DeviceAttr.LinkLayer): on
	// InfiniBand the QP's path is LID-routed (AddressVector), with SL and
	// SrcPathBits; otherwise RoCE's GRH to Remote.GID.
	LinkLayer   LinkLayer
	SL          uint8
	SrcPathBits uint8
}

// ConnectQP moves an RC or UC QP from RESET to RTS, connected to remote,
// with the attribute masks libibverbs requires for each transition.
func ConnectQP(qp QP, remote Remote, o PathOptions) error {
	if o.MTU == 0 {
		o.MTU = MTU1024
	}
	if o.Timeout == 0 {
		o.Timeout = 14
	}
	if o.RetryCnt == 0 {
		o.RetryCnt = 7
	}
	if o.RNRRetry == 0 {
		o.RNRRetry = 7
	}
	if o.MinRNRTimer == 0 {
		o.MinRNRTimer = 12
	}
	if o.MaxRdAtomic == 0 {
		o.MaxRdAtomic = 16
	}
	rc := qp.Type() == QPTypeRC
	if !rc && qp.Type() != QPTypeUC {
		return fmt.Errorf("verbs: connect %v QP %#x: %w: only RC and UC QPs connect", qp.Type(), qp.QPN(), ErrInvalid)
	}
	av, err := AddressVector(o.LinkLayer, remote, o.SL, o.SrcPathBits)
	if err != nil {
		return fmt.Errorf("verbs: connect QP %#x to %#x: %w", qp.QPN(), remote.QPN, err)
	}
	init := QPAttr{State: QPStateInit, Port: 1, AccessFlags: o.Access}
	if err := qp.Modify(&init, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrAccessFlags); err != nil {
		return fmt.Errorf("verbs: connect QP %#x: to INIT: %w", qp.QPN(), err)
	}
	rtr := QPAttr{State: QPStateRTR, PathMTU: o.MTU, DestQPN: remote.QPN, RQPSN: remote.PSN,
		AH: av, MaxDestRdAtomic: o.MaxRdAtomic, MinRNRTimer: o.MinRNRTimer}
	mask := QPAttrState | QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN
	if rc {
		mask |= QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer
	}
	if err := qp.Modify(&rtr, mask); err != nil {
		return fmt.Errorf("verbs: connect QP %#x to %#x at %v: to RTR: %w", qp.QPN(), remote.QPN, remote.GID, err)
	}
	rts := QPAttr{State: QPStateRTS, SQPSN: o.SQPSN, Timeout: o.Timeout, RetryCnt: o.RetryCnt, RNRRetry: o.RNRRetry, MaxRdAtomic: o.MaxRdAtomic}
	mask = QPAttrState | QPAttrSQPSN
	if rc {
		mask |= QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrMaxQPRdAtomic
	}
	if err := qp.Modify(&rts, mask); err != nil {
		return fmt.Errorf("verbs: connect QP %#x: to RTS: %w", qp.QPN(), err)
	}
	return nil
}

// ActivateUD moves a UD QP from RESET to RTS with Q_Key qkey.
func ActivateUD(qp QP, qkey uint32, sqpsn uint32) error {
	if qp.Type() != QPTypeUD {
		return fmt.Errorf("verbs: activate %v QP %#x as UD: %w", qp.Type(), qp.QPN(), ErrInvalid)
	}
	if err := qp.Modify(&QPAttr{State: QPStateInit, Port: 1, QKey: qkey}, QPAttrState|QPAttrPKeyIndex|QPAttrPort|QPAttrQKey); err != nil {
		return fmt.Errorf("verbs: activate UD QP %#x: to INIT: %w", qp.QPN(), err)
	}
	if err := qp.Modify(&QPAttr{State: QPStateRTR}, QPAttrState); err != nil {
		return fmt.Errorf("verbs: activate UD QP %#x: to RTR: %w", qp.QPN(), err)
	}
	if err := qp.Modify(&QPAttr{State: QPStateRTS, SQPSN: sqpsn}, QPAttrState|QPAttrSQPSN); err != nil {
		return fmt.Errorf("verbs: activate UD QP %#x: to RTS: %w", qp.QPN(), err)
	}
	return nil
}
