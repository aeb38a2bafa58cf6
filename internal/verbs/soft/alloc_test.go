//go:build !race

// Allocation counts are only meaningful without the race detector, which
// allocates on its own; hack/test.sh runs these in a second, non-race pass.

package soft

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestHotPathAllocatesNothing: post, deliver (fabric and both devices'
// receive paths, ACK included) and poll allocate nothing per message.
func TestHotPathAllocatesNothing(t *testing.T) {
	p := newRCPair(t, wire.NewFabric(wire.Faults{}), verbs.MTU1024)
	send := []verbs.SendWR{{WRID: 1, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 0, 64)}}
	recv := []verbs.RecvWR{{WRID: 2, NumSGE: 1, SG: sge(p.mrb, 0, 4096)}}
	write := []verbs.SendWR{{WRID: 3, Opcode: verbs.WRRDMAWriteWithImm, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 0, 3000), RemoteAddr: p.mrb.Addr() + 8192, RKey: p.mrb.RKey()}}
	read := []verbs.SendWR{{WRID: 4, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 65536, 3000), RemoteAddr: p.mrb.Addr() + 8192, RKey: p.mrb.RKey()}}
	wc := make([]verbs.WC, 4)
	round := func() {
		if _, err := p.qb.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := p.qa.PostSend(send); err != nil {
			t.Fatal(err)
		}
		pollOne(t, p.cqb, wc)
		pollOne(t, p.cqa, wc)
		if _, err := p.qb.PostRecv(recv); err != nil {
			t.Fatal(err)
		}
		if _, err := p.qa.PostSend(write); err != nil {
			t.Fatal(err)
		}
		pollOne(t, p.cqb, wc)
		pollOne(t, p.cqa, wc)
		if _, err := p.qa.PostSend(read); err != nil {
			t.Fatal(err)
		}
		pollOne(t, p.cqa, wc)
	}
	for range 100 {
		round() // warm pools
	}
	if n := testing.AllocsPerRun(500, round); n != 0 {
		t.Fatalf("send, write-with-imm and read round allocated %.1f times; want 0", n)
	}
}
