package engine

import (
	"testing"
	"unsafe"
)

// TestVConnLayout: a VConn is whole cache lines (so, allocated in a size
// class of whole lines, its lines are aligned), and the fields a message
// touches are in the lines VConn's comment says: the shared hot fields
// and the serving poller's (served) in the first two, the sender's queue
// (sender) in the three after them, its entries first.
func TestVConnLayout(t *testing.T) {
	var vc VConn
	if s := unsafe.Sizeof(vc); s%64 != 0 {
		t.Errorf("VConn is %d bytes; want a multiple of 64 (adjust its padding)", s)
	}
	line := func(off uintptr) uintptr { return off / 64 }
	srv, snd := unsafe.Offsetof(vc.srv), unsafe.Offsetof(vc.snd)
	for want, fields := range []map[string]uintptr{{
		"e": unsafe.Offsetof(vc.e), "tr": unsafe.Offsetof(vc.tr), "sq": unsafe.Offsetof(vc.sq),
		"state": unsafe.Offsetof(vc.state), "limit": unsafe.Offsetof(vc.limit),
		"window": unsafe.Offsetof(vc.window), "window's end": unsafe.Offsetof(vc.window) + unsafe.Sizeof(vc.window) - 1,
		"scheduled": unsafe.Offsetof(vc.scheduled), "id": unsafe.Offsetof(vc.id), "remote": unsafe.Offsetof(vc.remote),
		"srv.sent": srv + unsafe.Offsetof(vc.srv.sent), "srv.finPosted": srv + unsafe.Offsetof(vc.srv.finPosted),
	}, {
		"peer": unsafe.Offsetof(vc.peer), "handler": unsafe.Offsetof(vc.handler), "dq": unsafe.Offsetof(vc.dq), "regions": unsafe.Offsetof(vc.regions),
		"creditDue": unsafe.Offsetof(vc.creditDue), "ackDue": unsafe.Offsetof(vc.ackDue), "taken": unsafe.Offsetof(vc.taken),
		"finDue": unsafe.Offsetof(vc.finDue),
	}, 4: {
		"snd.mu": snd + unsafe.Offsetof(vc.snd.mu), "snd.seq": snd + unsafe.Offsetof(vc.snd.seq),
		"snd.head": snd + unsafe.Offsetof(vc.snd.head), "snd.tail": snd + unsafe.Offsetof(vc.snd.tail),
		"snd.waiting": snd + unsafe.Offsetof(vc.snd.waiting), "snd.closed": snd + unsafe.Offsetof(vc.snd.closed),
		"snd.creditWait": snd + unsafe.Offsetof(vc.snd.creditWait), "snd.uncounted": snd + unsafe.Offsetof(vc.snd.uncounted),
	}} {
		for name, off := range fields {
			if line(off) != uintptr(want) {
				t.Errorf("VConn.%s at offset %d: want it in cache line %d", name, off, want)
			}
		}
	}
	if off := snd + unsafe.Offsetof(vc.snd.ents); off != 128 {
		t.Errorf("VConn.snd.ents at offset %d: want 128, right after the hot lines", off)
	}
}
