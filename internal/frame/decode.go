package frame

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Decode parses one datagram. The frame's Payload aliases b.
func Decode(b []byte) (Frame, error) {
	if len(b) < HeaderLen {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrShort, len(b))
	}
	if b[0] != Version {
		return Frame{}, fmt.Errorf("%w %d", ErrVersion, b[0])
	}
	f := Frame{
		Op:     Op(b[1]),
		Flags:  binary.BigEndian.Uint16(b[2:]),
		Req:    binary.BigEndian.Uint32(b[4:]),
		Handle: binary.BigEndian.Uint32(b[8:]),
		Arg:    binary.BigEndian.Uint32(b[12:]),
		Arg2:   binary.BigEndian.Uint64(b[16:]),
	}
	n := binary.BigEndian.Uint32(b[24:])
	switch {
	case f.Op == 0 || f.Op >= opLimit:
		return Frame{}, fmt.Errorf("%w %d", ErrOp, b[1])
	case f.Flags&^knownFlags != 0:
		return Frame{}, fmt.Errorf("%w %#x", ErrFlags, f.Flags)
	case n > MaxPayload:
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrTooBig, n)
	case uint64(n) != uint64(len(b)-HeaderLen):
		return Frame{}, fmt.Errorf("%w: header says %d, datagram has %d", ErrLength, n, len(b)-HeaderLen)
	}
	f.Payload = b[HeaderLen:]
	return f, nil
}

// ErrPayload is a payload that does not parse for its op.
var ErrPayload = errors.New("frame: bad payload")

// DecodeHello parses a HelloInfo payload.
func DecodeHello(p []byte) (HelloInfo, error) {
	if len(p) < 12 || len(p) > 12+253 {
		return HelloInfo{}, fmt.Errorf("%w: hello info of %d bytes", ErrPayload, len(p))
	}
	return HelloInfo{
		Quota:      binary.BigEndian.Uint32(p),
		SendWindow: binary.BigEndian.Uint32(p[4:]),
		MaxMessage: binary.BigEndian.Uint32(p[8:]),
		Node:       string(p[12:]),
	}, nil
}

// DecodeLength parses the u32 length payload of LocalRead and Read.
func DecodeLength(p []byte) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%w: length of %d bytes", ErrPayload, len(p))
	}
	n := binary.BigEndian.Uint32(p)
	if n > MaxPayload {
		return 0, fmt.Errorf("%w: %d", ErrTooBig, n)
	}
	return n, nil
}

// StagedLen is the length of a Staged payload.
const StagedLen = 8

// DecodeStaged parses the payload of a Write or Read with FlagMemfd: the
// span of the vconn's staging memory its bytes are in, offset then
// length, each a u32. Whether the span lies in the staging memory is the
// agent's to check.
func DecodeStaged(p []byte) (off, n uint32, err error) {
	if len(p) != StagedLen {
		return 0, 0, fmt.Errorf("%w: staged span of %d bytes", ErrPayload, len(p))
	}
	return binary.BigEndian.Uint32(p), binary.BigEndian.Uint32(p[4:]), nil
}
