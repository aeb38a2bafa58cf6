package verbs

import "fmt"

// QPType is enum ibv_qp_type.
type QPType uint8

const (
	QPTypeRC QPType = 2
	QPTypeUC QPType = 3
	QPTypeUD QPType = 4
)

func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is enum ibv_qp_state.
type QPState uint8

const (
	QPStateReset QPState = 0
	QPStateInit  QPState = 1
	QPStateRTR   QPState = 2
	QPStateRTS   QPState = 3
	QPStateSQD   QPState = 4
	QPStateSQE   QPState = 5
	QPStateErr   QPState = 6
)

func (s QPState) String() string {
	switch s {
	case QPStateReset:
		return "RESET"
	case QPStateInit:
		return "INIT"
	case QPStateRTR:
		return "RTR"
	case QPStateRTS:
		return "RTS"
	case QPStateSQD:
		return "SQD"
	case QPStateSQE:
		return "SQE"
	case QPStateErr:
		return "ERR"
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// PortState is enum ibv_port_state: the state of a port, as
// ibv_query_port reports it. Only ACTIVE (and ACTIVE_DEFER) carry
// traffic; DOWN is a link without carrier or a netdev that is down.
type PortState uint8

const (
	PortStateNOP         PortState = 0
	PortStateDown        PortState = 1
	PortStateInit        PortState = 2
	PortStateArmed       PortState = 3
	PortStateActive      PortState = 4
	PortStateActiveDefer PortState = 5
)

// Active reports whether the port carries traffic: ACTIVE, or
// ACTIVE_DEFER (active, its link only briefly interrupted).
func (s PortState) Active() bool { return s == PortStateActive || s == PortStateActiveDefer }

// String is ibv_port_state_str's name, without the PORT_ prefix.
func (s PortState) String() string {
	switch s {
	case PortStateNOP:
		return "NOP"
	case PortStateDown:
		return "DOWN"
	case PortStateInit:
		return "INIT"
	case PortStateArmed:
		return "ARMED"
	case PortStateActive:
		return "ACTIVE"
	case PortStateActiveDefer:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// MTU is enum ibv_mtu: the path MTU of a connected QP.
type MTU uint8

const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the enum for 256, 512, 1024, 2048 or 4096 bytes.
func MTUFromBytes(n int) (MTU, error) {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m, nil
		}
	}
	return 0, fmt.Errorf("verbs: invalid MTU %d: want 256, 512, 1024, 2048 or 4096", n)
}

func (m MTU) String() string {
	if b := m.Bytes(); b != 0 {
		return fmt.Sprint(b)
	}
	return fmt.Sprintf("MTU(%d)", uint8(m))
}

// Access is enum ibv_access_flags.
type Access uint32

const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
	// AccessMWBind lets memory windows be bound to an MR.
	AccessMWBind Access = 1 << 4
	// AccessZeroBased, in SendWR.MWAccess, makes a window's remote
	// addresses offsets from 0 within the window instead of virtual
	// addresses.
	AccessZeroBased Access = 1 << 5
)

// Writable reports whether registering memory with a needs it mapped
// writable: any access that may change it, directly or by binding a
// window that does (the kernel's ib_access_writable).
func (a Access) Writable() bool {
	return a&(AccessLocalWrite|AccessRemoteWrite|AccessRemoteAtomic|AccessMWBind) != 0
}

// WROpcode is enum ibv_wr_opcode.
type WROpcode uint8

const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
	// WRLocalInv invalidates the memory window whose current key is
	// SendWR.RKey.
	WRLocalInv WROpcode = 7
	// WRBindMW binds memory window SendWR.MW (see SendWR).
	WRBindMW WROpcode = 8
)

func (o WROpcode) String() string {
	switch o {
	case WRRDMAWrite:
		return "RDMA_WRITE"
	case WRRDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSend:
		return "SEND"
	case WRSendWithImm:
		return "SEND_WITH_IMM"
	case WRRDMARead:
		return "RDMA_READ"
	case WRLocalInv:
		return "LOCAL_INV"
	case WRBindMW:
		return "BIND_MW"
	}
	return fmt.Sprintf("WROpcode(%d)", uint8(o))
}

// SendFlags is enum ibv_send_flags.
type SendFlags uint32

const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// WCOpcode is enum ibv_wc_opcode.
type WCOpcode uint8

const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCBindMW          WCOpcode = 5
	WCLocalInv        WCOpcode = 6
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "SEND"
	case WCRDMAWrite:
		return "RDMA_WRITE"
	case WCRDMARead:
		return "RDMA_READ"
	case WCBindMW:
		return "BIND_MW"
	case WCLocalInv:
		return "LOCAL_INV"
	case WCRecv:
		return "RECV"
	case WCRecvRDMAWithImm:
		return "RECV_RDMA_WITH_IMM"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint8(o))
}

// WCFlags is enum ibv_wc_flags.
type WCFlags uint8

const (
	WCWithGRH WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1
)

// WCStatus is enum ibv_wc_status.
type WCStatus uint8

const (
	WCSuccess        WCStatus = 0
	WCLocLenErr      WCStatus = 1
	WCLocQPOpErr     WCStatus = 2
	WCLocEECOpErr    WCStatus = 3
	WCLocProtErr     WCStatus = 4
	WCWRFlushErr     WCStatus = 5
	WCMWBindErr      WCStatus = 6
	WCBadRespErr     WCStatus = 7
	WCLocAccessErr   WCStatus = 8
	WCRemInvReqErr   WCStatus = 9
	WCRemAccessErr   WCStatus = 10
	WCRemOpErr       WCStatus = 11
	WCRetryExcErr    WCStatus = 12
	WCRNRRetryExcErr WCStatus = 13
	WCLocRDDViolErr  WCStatus = 14
	WCRemInvRDReqErr WCStatus = 15
	WCRemAbortErr    WCStatus = 16
	WCInvEECNErr     WCStatus = 17
	WCInvEECStateErr WCStatus = 18
	WCFatalErr       WCStatus = 19
	WCRespTimeoutErr WCStatus = 20
	WCGeneralErr     WCStatus = 21
)

var wcStatusStr = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error",
	"remote access error", "remote operation error", "transport retry counter exceeded",
	"RNR retry counter exceeded", "local RDD violation error", "remote invalid RD request",
	"aborted error", "invalid EE context number", "invalid EE context state",
	"fatal error", "response timeout error", "general error",
}

// String is ibv_wc_status_str.
func (s WCStatus) String() string {
	if int(s) < len(wcStatusStr) {
		return wcStatusStr[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint8(s))
}

// QPAttrMask is enum ibv_qp_attr_mask: which QPAttr fields Modify reads.
type QPAttrMask uint32

const (
	QPAttrState           QPAttrMask = 1 << 0
	QPAttrCurState        QPAttrMask = 1 << 1
	QPAttrAccessFlags     QPAttrMask = 1 << 3
	QPAttrPKeyIndex       QPAttrMask = 1 << 4
	QPAttrPort            QPAttrMask = 1 << 5
	QPAttrQKey            QPAttrMask = 1 << 6
	QPAttrAV              QPAttrMask = 1 << 7
	QPAttrPathMTU         QPAttrMask = 1 << 8
	QPAttrTimeout         QPAttrMask = 1 << 9
	QPAttrRetryCnt        QPAttrMask = 1 << 10
	QPAttrRNRRetry        QPAttrMask = 1 << 11
	QPAttrRQPSN           QPAttrMask = 1 << 12
	QPAttrMaxQPRdAtomic   QPAttrMask = 1 << 13
	QPAttrMinRNRTimer     QPAttrMask = 1 << 15
	QPAttrSQPSN           QPAttrMask = 1 << 16
	QPAttrMaxDestRdAtomic QPAttrMask = 1 << 17
	QPAttrCap             QPAttrMask = 1 << 19
	QPAttrDestQPN         QPAttrMask = 1 << 20
)

// LinkLayer is a port's link layer, with libibverbs' numbering
// (IBV_LINK_LAYER_*). Unspecified is what old providers report for an
// InfiniBand port; RDMAvisor treats it as RoCE, the only link layer it is
// tested on (see AddressVector).
type LinkLayer uint8

const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkLayerUnspecified:
		return "unspecified"
	case LinkLayerInfiniBand:
		return "InfiniBand"
	case LinkLayerEthernet:
		return "Ethernet"
	}
	return fmt.Sprintf("LinkLayer(%d)", uint8(l))
}
