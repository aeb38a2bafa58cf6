package soft

import (
	"bytes"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

func TestBigWriteRead(t *testing.T) {
	for _, tc := range []struct {
		mtu verbs.MTU
		f   wire.Faults
	}{
		{verbs.MTU1024, wire.Faults{}},
		{verbs.MTU4096, wire.Faults{}},
		{verbs.MTU1024, wire.Faults{Seed: 1, Loss: 0.05, Reorder: 0.05, Duplicate: 0.01}},
		{verbs.MTU4096, wire.Faults{Seed: 2, Loss: 0.05, Reorder: 0.05, Duplicate: 0.01}},
	} {
		mtu := tc.mtu
		p := newRCPair(t, wire.NewFabric(tc.f), mtu)
		const n = 1 << 20
		src := p.mra.Bytes()[:n]
		for i := range src {
			src[i] = byte(i*31 + 5)
		}
		wc := make([]verbs.WC, 1)
		if _, err := p.qa.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 0, n), RemoteAddr: p.mrb.Addr() + n, RKey: p.mrb.RKey()}}); err != nil {
			t.Fatal(err)
		}
		pollOne(t, p.cqa, wc)
		if !bytes.Equal(p.mrb.Bytes()[n:2*n], src) {
			t.Fatalf("mtu %v: write mismatch", mtu)
		}
		if _, err := p.qa.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 2*n, n), RemoteAddr: p.mrb.Addr() + n, RKey: p.mrb.RKey()}}); err != nil {
			t.Fatal(err)
		}
		pollOne(t, p.cqa, wc)
		if !bytes.Equal(p.mra.Bytes()[2*n:3*n], src) {
			t.Fatalf("mtu %v: read mismatch; stats %+v", mtu, p.da.Stats())
		}
	}
}

func TestBigWriteReadUDP(t *testing.T) {
	devs := udpDevices(t, 2)
	p := newRCPairOn(t, devs[0], devs[1], verbs.MTU4096)
	const n = 1 << 20
	src := p.mra.Bytes()[:n]
	for i := range src {
		src[i] = byte(i*31 + 5)
	}
	wc := make([]verbs.WC, 1)
	if _, err := p.qa.PostSend([]verbs.SendWR{{WRID: 1, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 0, n), RemoteAddr: p.mrb.Addr() + n, RKey: p.mrb.RKey()}}); err != nil {
		t.Fatal(err)
	}
	pollOne(t, p.cqa, wc)
	if !bytes.Equal(p.mrb.Bytes()[n:2*n], src) {
		for i := range src {
			if p.mrb.Bytes()[n+i] != src[i] {
				t.Fatalf("write mismatch at %d; stats a %+v b %+v", i, p.da.Stats(), p.db.Stats())
			}
		}
	}
	if _, err := p.qa.PostSend([]verbs.SendWR{{WRID: 2, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, NumSGE: 1, SG: sge(p.mra, 2*n, n), RemoteAddr: p.mrb.Addr() + n, RKey: p.mrb.RKey()}}); err != nil {
		t.Fatal(err)
	}
	pollOne(t, p.cqa, wc)
	if !bytes.Equal(p.mra.Bytes()[2*n:3*n], src) {
		t.Fatalf("read mismatch; stats %+v", p.da.Stats())
	}
}
