package vqpn

import "fmt"

// VQPN is a virtual QP number. Only the low 24 bits are valid (the width of
// an InfiniBand QPN); 0 is invalid.
type VQPN uint32

// Gen is a vQPN's generation. Issued generations run 1..255; 0 is never
// issued.
type Gen uint8

// ID names one vconn: its vQPN in bits 31..8 and its generation in bits 7..0.
// It is carried as imm_data and as the high half of wr_id.
type ID uint32

const (
	// MaxVQPN is the largest vQPN.
	MaxVQPN VQPN = 1<<24 - 1
	// MaxCapacity is the largest table capacity: every vQPN but 0.
	MaxCapacity = int(MaxVQPN)

	genBits = 8
	genMask = 1<<genBits - 1
)

// Valid reports whether v can name a vconn: it is not 0 and fits 24 bits.
func (v VQPN) Valid() bool { return v != 0 && v <= MaxVQPN }

// next returns the generation that follows g: 1..255, then 1; 0 is skipped.
func (g Gen) next() Gen { return g%genMask + 1 }

// MakeID packs a vQPN and a generation. Bits of v above the 24th are
// dropped.
func MakeID(v VQPN, g Gen) ID { return ID(v&MaxVQPN)<<genBits | ID(g) }

// VQPN returns the vQPN of id.
func (id ID) VQPN() VQPN { return VQPN(id >> genBits) }

// Gen returns the generation of id.
func (id ID) Gen() Gen { return Gen(id & genMask) }

// Valid reports whether id could have been issued by a Table: its vQPN is
// not 0 and its generation is not 0. It says nothing about whether id is
// live.
func (id ID) Valid() bool { return id.VQPN() != 0 && id.Gen() != 0 }

// String formats id as vQPN/gen, e.g. "0x00002a/3".
func (id ID) String() string { return fmt.Sprintf("0x%06x/%d", uint32(id.VQPN()), id.Gen()) }

// Imm returns the imm_data (host order) that carries id.
func Imm(id ID) uint32 { return uint32(id) }

// FromImm returns the ID carried by imm_data (host order).
func FromImm(imm uint32) ID { return ID(imm) }

// WRID returns the wr_id that carries id and the caller's slot: id in the
// high 32 bits, slot in the low 32.
func WRID(id ID, slot uint32) uint64 { return uint64(id)<<32 | uint64(slot) }

// SplitWRID returns the ID and slot carried by a wr_id. It is total: every
// wr_id decodes, and WRID(SplitWRID(w)) == w.
func SplitWRID(wrid uint64) (ID, uint32) { return ID(wrid >> 32), uint32(wrid) }
