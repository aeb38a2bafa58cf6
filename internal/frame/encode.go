package frame

import (
	"encoding/binary"
	"fmt"
)

// Append encodes f after dst and returns the extended slice. It fails only
// when the payload is larger than MaxPayload.
func Append(dst []byte, f *Frame) ([]byte, error) {
	if len(f.Payload) > MaxPayload {
		return dst, fmt.Errorf("%w: %d bytes", ErrTooBig, len(f.Payload))
	}
	var h [HeaderLen]byte
	h[0] = Version
	h[1] = byte(f.Op)
	binary.BigEndian.PutUint16(h[2:], f.Flags)
	binary.BigEndian.PutUint32(h[4:], f.Req)
	binary.BigEndian.PutUint32(h[8:], f.Handle)
	binary.BigEndian.PutUint32(h[12:], f.Arg)
	binary.BigEndian.PutUint64(h[16:], f.Arg2)
	binary.BigEndian.PutUint32(h[24:], uint32(len(f.Payload)))
	dst = append(dst, h[:]...)
	return append(dst, f.Payload...), nil
}

// AppendHello encodes a HelloInfo payload after dst.
func AppendHello(dst []byte, h HelloInfo) []byte {
	dst = binary.BigEndian.AppendUint32(dst, h.Quota)
	dst = binary.BigEndian.AppendUint32(dst, h.SendWindow)
	dst = binary.BigEndian.AppendUint32(dst, h.MaxMessage)
	return append(dst, h.Node...)
}

// AppendLength encodes the u32 length payload of LocalRead and Read.
func AppendLength(dst []byte, n uint32) []byte { return binary.BigEndian.AppendUint32(dst, n) }

// AppendStaged encodes the span of staging memory of a Write or Read with
// FlagMemfd after dst.
func AppendStaged(dst []byte, off, n uint32) []byte {
	dst = binary.BigEndian.AppendUint32(dst, off)
	return binary.BigEndian.AppendUint32(dst, n)
}
