// Package frame is the application protocol between a pod and its node
// agent: one frame per SOCK_SEQPACKET datagram on the allocation's socket.
//
// Every frame has a 28-byte header, big-endian, then its payload:
//
//	offset size field
//	0      1    version  protocol version, Version (1)
//	1      1    op       operation (Op)
//	2      2    flags    FlagImm, FlagBridge, FlagMemfd; other bits must
//	                     be zero
//	4      4    req      request id chosen by the client, echoed in the
//	                     reply; 0 on frames the agent pushes
//	8      4    handle   vconn or listener handle, 0 when none
//	12     4    arg      port, immediate, window grant, error code,
//	                     access, or region id (per op)
//	16     8    arg2     size or offset (per op)
//	24     4    length   payload length: the datagram's length less 28
//	28     len  payload  at most MaxPayload bytes
//
// Requests (client to agent; each answered by OK or Error with its req,
// except Grant, sent with req 0 and never answered: its failure is an
// Error push on the handle it named). A request other than Grant with
// req 0, and a Grant on handle 0, end the session (docs/protocol.md §8):
//
//	op         handle    arg       arg2  payload            OK reply
//	Hello      -         version   -     -                  arg version, arg2 Features, payload HelloInfo
//	Listen     -         port      -     -                  handle listener, payload the address bound
//	Dial       -         -         -     "host:port"        handle vconn, arg2 VConnInfo, payload remote address
//	Send       vconn     imm       -     message            -
//	Grant      vconn     n         -     -                  (none)
//	Close      any       -         -     -                  -
//	Export     vconn     access    size  -                  arg region (FlagMemfd: SCM_RIGHTS its memfd)
//	Unexport   vconn     region    -     -                  -
//	LocalRead  vconn     region    off   u32 length         payload bytes
//	LocalWrite vconn     region    off   bytes              -
//	Write      vconn     region    off   bytes              -   (RDMA WRITE on the peer's region)
//	Read       vconn     region    off   u32 length         payload bytes (RDMA READ)
//	Shm        vconn     -         -     -                  payload shm.Layout, SCM_RIGHTS memfd + 2 doorbells
//	Stage      vconn     -         size  -                  arg2 size, SCM_RIGHTS memfd (staging memory)
//
// With FlagMemfd, Write and Read carry no bytes: their payload is a
// Staged span (u32 offset, u32 length) of the vconn's staging memory
// (Stage), which the RDMA WRITE reads from and the RDMA READ lands in,
// and Read's OK has no payload.
//
// Pushes (agent to client, req 0):
//
//	op      handle    arg          payload
//	Data    vconn     imm          message (only while the client has granted window)
//	EOF     vconn     -            -        (the peer closed; no more Data)
//	Accept  listener  new vconn    remote address   (arg2 VConnInfo)
//	Error   vconn     code         message (the vconn failed)
//
// Addresses: a pod's allocation listens on its pod's port space, and the
// address bound is "podIP:port"; an allocation made for host services
// (not for a pod) listens on the node's, "node:port". Dial takes an IP
// (a pod's, or a node's for its host services) or a node name; any other
// name is answered with CodeUnknownHost, and the client resolves it (DNS)
// to IPs and dials those.
//
// Flow control: the agent pushes Data for a vconn only while the client's
// window (the sum of its Grants, less what was pushed) is positive, and
// reads from the engine only then, so a slow application holds the
// engine's per-vconn credits rather than agent memory. A client may have at
// most HelloInfo.SendWindow Sends of one vconn unanswered.
//
// Shm moves a vconn's messages to shared memory (package shm): the client
// asks before it grants any window, and from the OK on, Send and Data of
// that vconn travel in the memfd's rings, EOF and the vconn's failure as
// the RX ring's last descriptor; Grants for it are ignored. A client that
// gets Error (or no descriptors) stays on the socket.
//
// An Export with FlagMemfd (where the agent offers FeatureMemfd) puts the
// region in a sealed memfd the agent registers and passes with the OK:
// the client maps it and reads and writes its region as memory. Without
// it (or from an OK without a descriptor) the region's bytes are reached
// with LocalRead and LocalWrite, copied over the socket; they reach a
// mapped region too.
package frame

import (
	"errors"
	"fmt"
)

// Version is the protocol version this package speaks, and MinVersion the
// oldest an agent still accepts in a Hello (docs/upgrades.md: a pod's
// library a release behind its agent works). Compatible additions are not
// versions but features (Hello's arg2) the agent offers and a client uses
// only if it knows them; the version changes only for what an older
// client would misread. The header's version byte is the wire format's,
// which no release has changed.
const (
	Version    = 1
	MinVersion = 1
)

// HeaderLen is the fixed header's length; MaxPayload bounds the payload,
// so a frame is at most MaxFrame bytes.
const (
	HeaderLen  = 28
	MaxPayload = 64 << 10
	MaxFrame   = HeaderLen + MaxPayload
)

// Op is a frame's operation.
type Op uint8

// Operations.
const (
	OpHello Op = iota + 1
	OpListen
	OpDial
	OpSend
	OpGrant
	OpClose
	OpExport
	OpUnexport
	OpLocalRead
	OpLocalWrite
	OpWrite
	OpRead
	OpOK
	OpError
	OpData
	OpEOF
	OpAccept
	OpShm
	OpStage
	opLimit
)

var opNames = [...]string{"", "hello", "listen", "dial", "send", "grant", "close", "export", "unexport",
	"local-read", "local-write", "write", "read", "ok", "error", "data", "eof", "accept", "shm", "stage"}

func (o Op) String() string {
	if o > 0 && o < opLimit {
		return opNames[o]
	}
	return fmt.Sprintf("Op(%d)", uint8(o))
}

// Flags.
const (
	// FlagImm says the message carries an application immediate in arg.
	FlagImm uint16 = 1 << 0
	// FlagBridge, on Dial and Listen, asks that the vconns be handed to
	// the client as stream sockets the agent bridges to them (for
	// programs that know only TCP: the preload library). Dial's OK and
	// each Accept then carry the socket (SCM_RIGHTS) and no handle; the
	// vconn is the socket's from then on, and ends when it is closed.
	FlagBridge uint16 = 1 << 1
	// FlagMemfd, on Export, asks for the region in memory the client
	// maps: the OK carries the region's memfd (SCM_RIGHTS), sealed
	// against shrinking and growing, of at least the region's size.
	// Only for an agent that offers FeatureMemfd: one that predates it
	// refuses the flag and ends the session. On Write and Read (where
	// FeatureStage is offered) it says the bytes are in the vconn's
	// staging memory, at the span the payload names (Staged).
	FlagMemfd uint16 = 1 << 2

	knownFlags = FlagImm | FlagBridge | FlagMemfd
)

// Features is what an agent offers beyond the protocol's first form, in
// the arg2 of its OK to Hello (0 from an agent that predates them). A
// client uses a feature only where it is offered.
type Features uint64

// Features.
const (
	// FeatureMemfd: Export takes FlagMemfd.
	FeatureMemfd Features = 1 << 0
	// FeatureStage: Stage, and Write and Read with FlagMemfd.
	FeatureStage Features = 1 << 1
)

// Frame is one protocol frame. A decoded frame's Payload aliases the
// datagram it was decoded from.
type Frame struct {
	Op      Op
	Flags   uint16
	Req     uint32
	Handle  uint32
	Arg     uint32
	Arg2    uint64
	Payload []byte
}

// Code is an error class carried in Error frames.
type Code uint32

// Error codes.
const (
	CodeBadRequest   Code = 1  // malformed frame or arguments
	CodeVersion      Code = 2  // protocol version not supported
	CodeQuota        Code = 3  // the allocation's vconns are all in use
	CodeNoHandle     Code = 4  // no such handle on this connection
	CodeRefused      Code = 5  // nothing listens at the address, or a NetworkPolicy refuses the dial
	CodeUnreachable  Code = 6  // the address names no known node
	CodeClosed       Code = 7  // the vconn is closed
	CodeReset        Code = 8  // the peer aborted the vconn, or closed it past a lost message
	CodePeerGone     Code = 9  // the peer node is gone
	CodeTooLarge     Code = 10 // a message, region or read larger than its maximum
	CodeInternal     Code = 11 // the agent failed
	CodeAddrInUse    Code = 12 // the port already has a listener
	CodeRegion       Code = 13 // region missing, out of bounds or not allowed
	CodeWindow       Code = 14 // more Sends outstanding than the window
	CodeShuttingDown Code = 15 // the agent is stopping
	CodeLimit        Code = 16 // a limit of the allocation (sessions, listeners, regions) is reached
	CodeNoAddress    Code = 17 // the allocation's pod has no address (yet): its pod is not known
	CodeUnknownHost  Code = 18 // the dialed host is no IP and no node name the agent knows
)

var codeNames = map[Code]string{
	CodeBadRequest: "bad request", CodeVersion: "unsupported version", CodeQuota: "vconn quota exhausted",
	CodeNoHandle: "no such handle", CodeRefused: "connection refused", CodeUnreachable: "node unreachable",
	CodeClosed: "vconn closed", CodeReset: "vconn reset by peer", CodePeerGone: "peer node gone",
	CodeTooLarge: "message too large", CodeInternal: "internal error", CodeAddrInUse: "address in use",
	CodeRegion: "region access denied", CodeWindow: "send window exceeded", CodeShuttingDown: "agent shutting down",
	CodeLimit: "allocation limit reached", CodeNoAddress: "no address for the allocation's pod",
	CodeUnknownHost: "unknown host",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("code %d", uint32(c))
}

// Errors of Decode.
var (
	ErrShort   = errors.New("frame: shorter than its header")
	ErrVersion = errors.New("frame: unsupported version")
	ErrOp      = errors.New("frame: unknown op")
	ErrLength  = errors.New("frame: length does not match the datagram")
	ErrFlags   = errors.New("frame: unknown flags")
	ErrTooBig  = errors.New("frame: payload larger than MaxPayload")
)

// HelloInfo is the payload of the OK reply to Hello.
type HelloInfo struct {
	Quota      uint32 // vconns the allocation may hold open
	SendWindow uint32 // Sends of one vconn that may be unanswered
	MaxMessage uint32 // largest message payload of any vconn (each one's own: VConnInfo)
	Node       string // the agent's node name
}
