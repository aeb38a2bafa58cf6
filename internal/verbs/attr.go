package verbs

import (
	"fmt"
	"net/netip"
)

// GID is a 128-bit global identifier. For RoCEv2 it is the port's IP
// address, IPv4 as an IPv4-mapped IPv6 address.
type GID [16]byte

// GIDFromAddr returns the RoCEv2 GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Addr returns the IP address the GID stands for (unmapped when IPv4).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return g.Addr().String() }

// DeviceAttr is the part of struct ibv_device_attr (and port attributes)
// that RDMAvisor reads.
type DeviceAttr struct {
	Name      string
	Vendor    string
	NodeGUID  uint64
	MaxQP     int
	MaxQPWR   int
	MaxSGE    int
	MaxCQ     int
	MaxCQE    int
	MaxMR     int
	MaxMRSize uint64
	// MaxMW is how many memory windows the device supports; 0 when it has
	// no type 2 windows (max_mw, and IBV_DEVICE_MEM_WINDOW_TYPE_2A or _2B).
	MaxMW     int
	MaxPD     int
	MaxSRQ    int
	MaxSRQWR  int
	MaxAH     int
	ActiveMTU MTU
	MaxMTU    MTU
	PortCount int
	NUMANode  int // -1 when unknown
	// LinkLayer is the port's: Ethernet (RoCE) for the soft provider.
	LinkLayer LinkLayer
	// LID is the port's base LID and LMC its LID mask count (the port
	// answers to LID..LID+2^LMC-1); both zero on Ethernet.
	LID uint16
	LMC uint8
}

// QPCap is struct ibv_qp_cap.
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPInitAttr is struct ibv_qp_init_attr with handles instead of pointers to
// the CQs and SRQ.
type QPInitAttr struct {
	Type   QPType
	SendCQ CQ
	RecvCQ CQ
	SRQ    SRQ // nil: the QP has its own receive queue
	Cap    QPCap
	// SigAll makes every send WR signaled, as sq_sig_all.
	SigAll bool
}

// AHAttr is struct ibv_ah_attr. By default it is global (is_global 1): the
// packet carries a GRH and the destination is DGID, as RoCE needs. With
// NoGRH it is an InfiniBand address vector within one subnet (is_global
// 0): DLID routes the packet, and DGID, SGIDIndex, HopLimit, TrafficClass
// and FlowLabel are unused. AddressVector builds either.
type AHAttr struct {
	DGID         GID
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	SL           uint8
	PortNum      uint8
	// NoGRH, DLID and SrcPathBits are an InfiniBand path's (a path
	// record's fields): no GRH, the destination's LID, and the low bits
	// of the source LID (within the port's LMC) that pick one of the
	// port's paths.
	NoGRH       bool
	DLID        uint16
	SrcPathBits uint8
}

// QPAttr is struct ibv_qp_attr, restricted to what RC, UC and UD use.
type QPAttr struct {
	State           QPState
	CurState        QPState
	PathMTU         MTU
	QKey            uint32
	RQPSN           uint32
	SQPSN           uint32
	DestQPN         uint32
	AccessFlags     Access
	Cap             QPCap
	AH              AHAttr
	PKeyIndex       uint16
	Port            uint8
	MaxRdAtomic     uint8
	MaxDestRdAtomic uint8
	MinRNRTimer     uint8 // IB encoding, 0..31
	Timeout         uint8 // 4.096 µs × 2^Timeout; 0 waits forever
	RetryCnt        uint8 // 0..7
	RNRRetry        uint8 // 0..7; 7 retries forever
}

// SRQInitAttr is struct ibv_srq_init_attr.
type SRQInitAttr struct {
	MaxWR  uint32
	MaxSGE uint32
	Limit  uint32
}

// String prints the fields a QP transition depends on.
func (a *QPAttr) String() string {
	return fmt.Sprintf("state=%v mtu=%v dest_qpn=%#x rq_psn=%#x sq_psn=%#x", a.State, a.PathMTU, a.DestQPN, a.RQPSN, a.SQPSN)
}
