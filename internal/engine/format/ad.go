package format

import (
	"encoding/binary"
	"fmt"
)

// AdLen is the length of an export's payload, the region's ad:
//
//	0..7   address (0 when the region is a zero-based memory window)
//	8..11  rkey
//	12..19 length
//	20     access (AccessRead, AccessWrite)
const AdLen = 8 + 4 + 8 + 1

// Access bits of an ad; engine.Access has the same values.
const (
	AccessRead  = 1 << 0
	AccessWrite = 1 << 1
)

// Ad is a region an export message offers the peer vconn.
type Ad struct {
	Addr   uint64
	RKey   uint32
	Length uint64
	Access uint8
}

// Put encodes a into the first AdLen bytes of b.
func (a *Ad) Put(b []byte) {
	_ = b[AdLen-1]
	binary.BigEndian.PutUint64(b[0:], a.Addr)
	binary.BigEndian.PutUint32(b[8:], a.RKey)
	binary.BigEndian.PutUint64(b[12:], a.Length)
	b[20] = a.Access
}

// ParseAd decodes and checks an export's payload: a region of some bytes,
// with known access bits, that does not wrap the address space.
func ParseAd(payload []byte) (Ad, error) {
	if len(payload) != AdLen {
		return Ad{}, fmt.Errorf("engine: export message of %d bytes", len(payload))
	}
	a := Ad{
		Addr:   binary.BigEndian.Uint64(payload[0:]),
		RKey:   binary.BigEndian.Uint32(payload[8:]),
		Length: binary.BigEndian.Uint64(payload[12:]),
		Access: payload[20],
	}
	if a.Length == 0 || a.Access&^(AccessRead|AccessWrite) != 0 || a.Addr+a.Length < a.Addr {
		return Ad{}, fmt.Errorf("engine: bad export %+v", a)
	}
	return a, nil
}
