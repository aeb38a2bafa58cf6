package format

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// HeaderLen is the engine header at the start of every SEND payload.
//
//	0      type
//	1      flags (FlagFirst, FlagLast, FlagImm; FlagGap on a credit grant;
//	       FlagResent on an RC vconn's data chunk sent again)
//	2..3   the chunk's number on its vconn mod 2^16 (an Auto vconn's data
//	       sent on RC, toward an engine that takes it: what the receiver
//	       tells a resent chunk apart by, as arg on an RC vconn); else zero
//	4..7   credit: receive credits the sender has granted, cumulative
//	8..11  length: the whole message's length (data messages); with
//	       FlagGap, the first sequence number past the gap
//	12..15 seq: the message's sequence number on its vconn
//	16..19 imm: the application's immediate (FlagImm); a bundle's count
//	20..23 arg: the region's id (export, unexport, unexported); the
//	       acknowledgement (an Auto vconn's data, bundles and grants);
//	       the chunk's number on its vconn (an RC vconn's data: what the
//	       receiver tells a resent chunk apart by, after a QP replacement)
//	24..31 auth: the secret of the QP pair the message travels on (of
//	       the sender's datagrams, on UD), which the receiver drew and
//	       gave the sender over the control plane (Authentic); zero in
//	       the messages inside a bundle
//
// Fields that mean different things by type are read and written through
// the accessors named for each meaning, below; only Put and Parse (and
// Raw) know the offsets.
const HeaderLen = 32

const (
	offType   = 0
	offFlags  = 1
	offChunk  = 2
	offCredit = 4
	offLength = 8
	offSeq    = 12
	offImm    = 16
	offArg    = 20
	offAuth   = 24
)

// Type is a message's type.
type Type uint8

const (
	Data       Type = 1 // application data (one chunk of a message)
	Credit     Type = 2 // a credit grant and nothing else
	Fin        Type = 3 // the sender closed its side: no more data follows
	Export     Type = 4 // a region the sender exports to this vconn (payload: Ad)
	Unexport   Type = 5 // the region with id arg is no longer exported
	Reset      Type = 6 // the sender aborted the vconn
	Unexported Type = 7 // the sender stopped using region arg (answers Unexport)
	Bundle     Type = 8 // whole data messages, imm of them, each with its header (the engine's serve.go)
)

const (
	FlagFirst = 1 << 0
	FlagLast  = 1 << 1
	FlagImm   = 1 << 2
	// FlagGap, on an Auto vconn's credit grant: the sequence numbers from
	// its acknowledgement (arg) up to length are missing while later ones
	// arrived.
	FlagGap = 1 << 3
	// FlagResent, on a data chunk sent on RC: sent again on the QP that
	// replaced a failed one; the receiver may have it already (ChunkNo,
	// or AutoChunkNo, says).
	FlagResent = 1 << 4
)

// Header is a decoded message header.
type Header struct {
	Type   Type
	Flags  uint8
	Chunk  uint16
	Credit uint32
	Length uint32
	Seq    uint32
	Imm    uint32
	Arg    uint32
	Auth   uint64
}

// Headers by meaning.

// DataHeader starts the header of a data message of length bytes; the
// sender marks each chunk with SetChunk.
func DataHeader(length, seq, imm uint32, hasImm bool) Header {
	h := Header{Type: Data, Length: length, Seq: seq, Imm: imm}
	if hasImm {
		h.Flags |= FlagImm
	}
	return h
}

// ControlHeader is the header of a control message; RegionHeader that of
// a region's messages (export, unexport, unexported).
func ControlHeader(t Type) Header { return Header{Type: t, Flags: FlagFirst | FlagLast} }

func RegionHeader(t Type, id uint32) Header {
	h := ControlHeader(t)
	h.Arg = id
	return h
}

// BundleHeader heads a bundle of count messages, numbered from seq, in
// length bytes.
func BundleHeader(seq, count, length uint32) Header {
	h := ControlHeader(Bundle)
	h.Seq, h.Imm, h.Length = seq, count, length
	return h
}

// SetChunk marks a data header as the first and/or last chunk of its
// message.
func (h *Header) SetChunk(first, last bool) {
	h.Flags &^= FlagFirst | FlagLast
	if first {
		h.Flags |= FlagFirst
	}
	if last {
		h.Flags |= FlagLast
	}
}

func (h *Header) First() bool { return h.Flags&FlagFirst != 0 }

func (h *Header) Last() bool { return h.Flags&FlagLast != 0 }

func (h *Header) Whole() bool { return h.Flags&(FlagFirst|FlagLast) == FlagFirst|FlagLast }

// AppImm is a data message's application immediate.
func (h *Header) AppImm() (uint32, bool) { return h.Imm, h.Flags&FlagImm != 0 }

// Ack is the acknowledgement an Auto vconn's data, bundle or grant carries.
func (h *Header) Ack() uint32 { return h.Arg }

// Resent reports a data chunk sent again (FlagResent).
func (h *Header) Resent() bool { return h.Flags&FlagResent != 0 }

// ChunkNo is an RC vconn's data chunk's number: how many data chunks the
// vconn sent before it, mod 2^32.
func (h *Header) ChunkNo() uint32 { return h.Arg }

// AutoChunkNo is the number of an Auto vconn's data chunk sent on RC:
// how many of those the vconn sent before it, mod 2^16. A resend repeats
// at most a send queue's worth (the engine's SQDepth, at most 1<<15), so
// a receiver compares within that span.
func (h *Header) AutoChunkNo() uint16 { return h.Chunk }

// Region is the id of the region an export, unexport or unexported names.
func (h *Header) Region() uint32 { return h.Arg }

// Gap reports the end of a gap a grant reports (FlagGap): the first
// sequence number past it.
func (h *Header) Gap() (end uint32, ok bool) { return h.Length, h.Flags&FlagGap != 0 }

// Count is how many messages a bundle carries.
func (h *Header) Count() uint32 { return h.Imm }

var (
	ErrShortHeader = errors.New("engine: message shorter than its header")
	ErrBadHeader   = errors.New("engine: malformed message header")
)

// Put encodes h into the first HeaderLen bytes of b.
func (h *Header) Put(b []byte) {
	_ = b[HeaderLen-1]
	b[offType] = byte(h.Type)
	b[offFlags] = h.Flags
	binary.BigEndian.PutUint16(b[offChunk:], h.Chunk)
	binary.BigEndian.PutUint32(b[offCredit:], h.Credit)
	binary.BigEndian.PutUint32(b[offLength:], h.Length)
	binary.BigEndian.PutUint32(b[offSeq:], h.Seq)
	binary.BigEndian.PutUint32(b[offImm:], h.Imm)
	binary.BigEndian.PutUint32(b[offArg:], h.Arg)
	binary.BigEndian.PutUint64(b[offAuth:], h.Auth)
}

// Authentic reports whether a received message carries secret, the one
// the receiver gave the sender of the QP pair it came on (of the sender's
// datagrams, on UD): whether it came from the peer's engine, and not from
// a host that spoofs the peer's address. Secret 0 is no pair's: nothing
// matches it. The receiver checks it before it reads anything else of
// the message.
//
// A plain comparison, not a MAC over the message: the secret keeps out
// a host that cannot read the fabric, which is all a MAC would keep out
// too, since one that can read it learns the QPN and PSN as well and
// can forge RoCE itself; and a MAC would cost the receiver a pass over
// every byte. SECURITY.md has the threat model.
func Authentic(b []byte, secret uint64) bool {
	return len(b) >= HeaderLen && secret != 0 && binary.BigEndian.Uint64(b[offAuth:]) == secret
}

// Parse decodes and validates a header: a peer's bytes are not trusted.
func (h *Header) Parse(b []byte) error {
	if len(b) < HeaderLen {
		return ErrShortHeader
	}
	h.Type = Type(b[offType])
	h.Flags = b[offFlags]
	h.Chunk = binary.BigEndian.Uint16(b[offChunk:])
	h.Credit = binary.BigEndian.Uint32(b[offCredit:])
	h.Length = binary.BigEndian.Uint32(b[offLength:])
	h.Seq = binary.BigEndian.Uint32(b[offSeq:])
	h.Imm = binary.BigEndian.Uint32(b[offImm:])
	h.Arg = binary.BigEndian.Uint32(b[offArg:])
	h.Auth = binary.BigEndian.Uint64(b[offAuth:])
	if h.Type < Data || h.Type > Bundle || h.Flags&^(FlagFirst|FlagLast|FlagImm|FlagGap|FlagResent) != 0 {
		return ErrBadHeader
	}
	if h.Chunk != 0 && h.Type != Data {
		return ErrBadHeader // only data chunks are numbered there
	}
	if h.Type != Data && !h.Whole() {
		return ErrBadHeader // control messages are single chunks
	}
	if h.Flags&FlagResent != 0 && h.Type != Data {
		return ErrBadHeader // only data is resent
	}
	if h.Flags&FlagGap != 0 && (h.Type != Credit || int32(h.Length-h.Arg) <= 0) {
		return ErrBadHeader // a gap is reported on a grant, and ends past its start
	}
	if h.Type == Bundle && h.Flags&FlagImm != 0 {
		return ErrBadHeader // a bundle's messages carry their own immediates
	}
	return nil
}

func (h *Header) String() string {
	return fmt.Sprintf("type=%d flags=%#x credit=%d len=%d seq=%d", h.Type, h.Flags, h.Credit, h.Length, h.Seq)
}

// Raw reads and writes single fields of an encoded header in place: the
// poller classifies and stamps queued buffers without decoding them. The
// buffer is the engine's own (queued by its sender), never a peer's: Raw
// checks nothing.
type Raw []byte

func (b Raw) Type() Type { return Type(b[offType]) }

func (b Raw) Whole() bool { return b[offFlags]&(FlagFirst|FlagLast) == FlagFirst|FlagLast }

func (b Raw) First() bool { return b[offFlags]&FlagFirst != 0 }

func (b Raw) Last() bool { return b[offFlags]&FlagLast != 0 }

// Length is a data message's whole length (in every chunk).
func (b Raw) Length() uint32 { return binary.BigEndian.Uint32(b[offLength:]) }

func (b Raw) Seq() uint32 { return binary.BigEndian.Uint32(b[offSeq:]) }

func (b Raw) Count() uint32 { return binary.BigEndian.Uint32(b[offImm:]) }

func (b Raw) Ack() uint32 { return binary.BigEndian.Uint32(b[offArg:]) }

func (b Raw) SetCredit(c uint32) { binary.BigEndian.PutUint32(b[offCredit:], c) }

func (b Raw) SetAck(a uint32) { binary.BigEndian.PutUint32(b[offArg:], a) }

// SetResent marks a data chunk sent again (FlagResent).
func (b Raw) SetResent() { b[offFlags] |= FlagResent }

// SetChunkNo numbers an RC vconn's data chunk (Header.ChunkNo).
func (b Raw) SetChunkNo(n uint32) { binary.BigEndian.PutUint32(b[offArg:], n) }

// SetAutoChunkNo numbers an Auto vconn's data chunk sent on RC
// (Header.AutoChunkNo).
func (b Raw) SetAutoChunkNo(n uint16) { binary.BigEndian.PutUint16(b[offChunk:], n) }

func (b Raw) Auth() uint64 { return binary.BigEndian.Uint64(b[offAuth:]) }

// SetAuth stamps the secret of the QP pair the message goes on.
func (b Raw) SetAuth(secret uint64) { binary.BigEndian.PutUint64(b[offAuth:], secret) }

// SetGap marks a grant as reporting a gap that ends at end.
func (b Raw) SetGap(end uint32) {
	b[offFlags] |= FlagGap
	binary.BigEndian.PutUint32(b[offLength:], end)
}
