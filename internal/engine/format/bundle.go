package format

import "errors"

// A bundle is a Bundle header (length: the bytes after it; seq: its first
// message's; imm: how many messages) followed by whole data messages, each
// with its own Data header, numbered on from the bundle's seq. Why and
// when the engine bundles is its own business (engine/bundle.go); this is
// only the layout, and the check a receiver makes before it trusts one.

// MaxBundle is the most messages one bundle carries: a sender's ring's
// worth (engine.ringSize, which the engine checks equals it).
const MaxBundle = 16

var ErrBadBundle = errors.New("engine: malformed bundle")

// CheckBundle checks the messages of a bundle with header h: whole data
// messages, h.Count() of them (two or more, at most MaxBundle), numbered on
// from h.Seq, filling the payload exactly. Only the bundle carries the
// secret (Authentic): its messages' auth is zero.
func CheckBundle(h *Header, payload []byte) error {
	if uint32(len(payload)) != h.Length || h.Count() < 2 || h.Count() > MaxBundle {
		return ErrBadBundle
	}
	var rh Header
	k := uint32(0)
	for off := 0; off < len(payload); k++ {
		if k == h.Count() || rh.Parse(payload[off:]) != nil || rh.Type != Data || !rh.Whole() || rh.Auth != 0 || rh.Chunk != 0 ||
			rh.Seq != h.Seq+k || int(rh.Length) > len(payload)-off-HeaderLen {
			return ErrBadBundle
		}
		off += HeaderLen + int(rh.Length)
	}
	if k != h.Count() {
		return ErrBadBundle
	}
	return nil
}

// Bundled walks the messages of a bundle CheckBundle accepted:
//
//	for it := format.Bundled(payload); it.Next(); { it.Header, it.Data }
//
// It allocates nothing; Data aliases the payload, capped at its message.
type BundleIter struct {
	payload []byte
	off     int
	Header  Header
	Data    []byte
}

func Bundled(payload []byte) BundleIter { return BundleIter{payload: payload} }

// Next moves to the next message and reports whether there was one.
func (it *BundleIter) Next() bool {
	if it.off >= len(it.payload) {
		return false
	}
	_ = it.Header.Parse(it.payload[it.off:])
	it.off += HeaderLen
	n := int(it.Header.Length)
	it.Data = it.payload[it.off : it.off+n : it.off+n]
	it.off += n
	return true
}
