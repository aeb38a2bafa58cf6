//go:build ibverbs && linux

package ibv

// #include "shim.h"
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// The C helpers read verbs.SendWR, RecvWR and write verbs.WC through mirror
// structs (shim.h); a layout drift would corrupt work requests silently, so
// the package refuses to start with one.
func init() {
	var s verbs.SendWR
	var r verbs.RecvWR
	var w verbs.WC
	checks := []struct {
		name   string
		goVal  uintptr
		cIndex C.int
	}{
		{"sizeof SGE", unsafe.Sizeof(verbs.SGE{}), 0},
		{"sizeof SendWR", unsafe.Sizeof(s), 1},
		{"sizeof RecvWR", unsafe.Sizeof(r), 2},
		{"sizeof WC", unsafe.Sizeof(w), 3},
		{"SendWR.NumSGE", unsafe.Offsetof(s.NumSGE), 4},
		{"SendWR.Flags", unsafe.Offsetof(s.Flags), 5},
		{"SendWR.ImmData", unsafe.Offsetof(s.ImmData), 6},
		{"SendWR.RemoteAddr", unsafe.Offsetof(s.RemoteAddr), 7},
		{"SendWR.RemoteQKey", unsafe.Offsetof(s.RemoteQKey), 8},
		{"RecvWR.NumSGE", unsafe.Offsetof(r.NumSGE), 9},
		{"WC.VendorErr", unsafe.Offsetof(w.VendorErr), 10},
		{"WC.SrcQP", unsafe.Offsetof(w.SrcQP), 11},
		{"WC.PKeyIndex", unsafe.Offsetof(w.PKeyIndex), 12},
		{"SendWR.MW", unsafe.Offsetof(s.MW), 13},
		{"WC.SLID", unsafe.Offsetof(w.SLID), 14},
	}
	for _, c := range checks {
		if got := uintptr(C.rv_layout(c.cIndex)); got != c.goVal {
			panic(fmt.Sprintf("ibv: layout of %s: Go %d, C %d", c.name, c.goVal, got))
		}
	}
	if verbs.MaxSGE != C.RV_MAX_SGE {
		panic(fmt.Sprintf("ibv: verbs.MaxSGE %d, C RV_MAX_SGE %d", verbs.MaxSGE, C.RV_MAX_SGE))
	}
}
