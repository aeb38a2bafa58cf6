package engine

import (
	"testing"
	"unsafe"
)

// TestVConnLayout: a VConn is whole cache lines (so, allocated in a size
// class of whole lines, its lines are aligned), and the fields a message
// touches are in the lines VConn's comment says.
func TestVConnLayout(t *testing.T) {
	var vc VConn
	if s := unsafe.Sizeof(vc); s%64 != 0 {
		t.Errorf("VConn is %d bytes; want a multiple of 64 (adjust its padding)", s)
	}
	line := func(off uintptr) uintptr { return off / 64 }
	for name, off := range map[string]uintptr{
		"e": unsafe.Offsetof(vc.e), "tr": unsafe.Offsetof(vc.tr), "sq": unsafe.Offsetof(vc.sq),
		"sendMu": unsafe.Offsetof(vc.sendMu), "state": unsafe.Offsetof(vc.state), "limit": unsafe.Offsetof(vc.limit),
		"window": unsafe.Offsetof(vc.window), "window's end": unsafe.Offsetof(vc.window) + unsafe.Sizeof(vc.window) - 1,
		"txSeq": unsafe.Offsetof(vc.txSeq), "scheduled": unsafe.Offsetof(vc.scheduled), "ring.tail": unsafe.Offsetof(vc.ring) + 4,
	} {
		if line(off) != 0 {
			t.Errorf("VConn.%s at offset %d: want it in the first cache line", name, off)
		}
	}
	for name, off := range map[string]uintptr{
		"peer": unsafe.Offsetof(vc.peer), "handler": unsafe.Offsetof(vc.handler), "dq": unsafe.Offsetof(vc.dq), "regions": unsafe.Offsetof(vc.regions),
		"remote": unsafe.Offsetof(vc.remote), "sent": unsafe.Offsetof(vc.sent), "creditDue": unsafe.Offsetof(vc.creditDue),
		"ackDue": unsafe.Offsetof(vc.ackDue), "taken": unsafe.Offsetof(vc.taken), "txWaiting": unsafe.Offsetof(vc.txWaiting),
		"id": unsafe.Offsetof(vc.id),
	} {
		if line(off) != 1 {
			t.Errorf("VConn.%s at offset %d: want it in the second cache line", name, off)
		}
	}
	if off := unsafe.Offsetof(vc.ents); off != 128 {
		t.Errorf("VConn.ents at offset %d: want 128, right after the hot lines", off)
	}
}
