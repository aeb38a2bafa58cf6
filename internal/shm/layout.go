package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout sizes a Segment: two rings of Entries descriptors, each with a
// payload slab of Slab bytes, carrying messages of at most MaxMessage.
type Layout struct {
	Entries    uint32 // descriptors per ring, a power of two
	Slab       uint32 // payload bytes per ring, a multiple of CacheLine
	MaxMessage uint32 // largest payload of one descriptor, at most Slab/2
}

// CacheLine separates what the two sides write, so the producer's and
// consumer's stores do not share a line.
const CacheLine = 64

// Ring area: a header of four cache lines (tail, head, consumer sleeping,
// producer waiting), then the descriptors, then the slab.
const (
	offTail     = 0
	offHead     = CacheLine
	offConsWait = 2 * CacheLine
	offProdWait = 3 * CacheLine
	headerLen   = 4 * CacheLine
	// DescLen is one descriptor: offset, length, immediate, flags (u32 each,
	// little-endian: both sides run on the same host).
	DescLen = 16
)

// Limits a Layout must respect.
const (
	MaxEntries = 1 << 16
	MaxSlab    = 1 << 28
	pageSize   = 4096
)

// DefaultLayout fits the agent's largest socket message (64 KiB) twice in
// a slab, with room for 256 messages in flight each way.
var DefaultLayout = Layout{Entries: 256, Slab: 256 << 10, MaxMessage: 64 << 10}

// ErrLayout is a Layout out of its limits.
var ErrLayout = errors.New("shm: bad layout")

// Validate checks the limits above.
func (l Layout) Validate() error {
	switch {
	case l.Entries < 2 || l.Entries > MaxEntries || l.Entries&(l.Entries-1) != 0:
		return fmt.Errorf("%w: %d entries, want a power of two in 2..%d", ErrLayout, l.Entries, MaxEntries)
	case l.Slab < CacheLine || l.Slab > MaxSlab || l.Slab%CacheLine != 0:
		return fmt.Errorf("%w: slab of %d bytes, want a multiple of %d up to %d", ErrLayout, l.Slab, CacheLine, MaxSlab)
	case l.MaxMessage == 0 || l.MaxMessage > l.Slab/2:
		return fmt.Errorf("%w: max message %d with a slab of %d, want 1..slab/2", ErrLayout, l.MaxMessage, l.Slab)
	}
	return nil
}

// ringLen is one ring's area, rounded up to a page so the second ring
// starts page-aligned.
func (l Layout) ringLen() int {
	n := headerLen + int(l.Entries)*DescLen + int(l.Slab)
	return (n + pageSize - 1) &^ (pageSize - 1)
}

// Size is the memfd's length: both rings.
func (l Layout) Size() int { return 2 * l.ringLen() }

// LayoutLen is an encoded Layout's length.
const LayoutLen = 12

// AppendLayout encodes l after dst (big-endian, as the socket protocol).
func AppendLayout(dst []byte, l Layout) []byte {
	dst = binary.BigEndian.AppendUint32(dst, l.Entries)
	dst = binary.BigEndian.AppendUint32(dst, l.Slab)
	return binary.BigEndian.AppendUint32(dst, l.MaxMessage)
}

// DecodeLayout parses and validates an encoded Layout.
func DecodeLayout(p []byte) (Layout, error) {
	if len(p) != LayoutLen {
		return Layout{}, fmt.Errorf("%w: %d bytes, want %d", ErrLayout, len(p), LayoutLen)
	}
	l := Layout{Entries: binary.BigEndian.Uint32(p), Slab: binary.BigEndian.Uint32(p[4:]), MaxMessage: binary.BigEndian.Uint32(p[8:])}
	if err := l.Validate(); err != nil {
		return Layout{}, err
	}
	return l, nil
}
