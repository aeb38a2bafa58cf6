package wire

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"go.uber.org/goleak"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func gidOfString(s string) verbs.GID { return verbs.GIDFromAddr(netip.MustParseAddr(s)) }

var (
	gidA = gidOfString("10.0.0.1")
	gidB = gidOfString("10.0.0.2")
	gidC = gidOfString("10.0.0.3")
)

// mkPkts returns n packets of size bytes to dst, numbered from seq: the
// number in the first 4 bytes, then a pattern derived from it.
func mkPkts(n, size int, dst verbs.GID, seq uint32) []Packet {
	pkts := make([]Packet, n)
	for i := range pkts {
		pkts[i] = Packet{Buf: make([]byte, size), N: size, Addr: dst}
		fill(&pkts[i], seq+uint32(i))
	}
	return pkts
}

func fill(p *Packet, seq uint32) {
	b := p.Buf[:p.N]
	if len(b) >= 4 {
		binary.BigEndian.PutUint32(b, seq)
	}
	for i := 4; i < len(b); i++ {
		b[i] = byte(seq) + byte(i)
	}
}

func seqOf(p *Packet) uint32 { return binary.BigEndian.Uint32(p.Buf[:4]) }

// checkPayload verifies a received packet against the pattern of fill.
func checkPayload(t testing.TB, p *Packet, size int) {
	t.Helper()
	if p.N != size {
		t.Fatalf("received %d bytes, want %d", p.N, size)
	}
	seq := seqOf(p)
	for i := 4; i < p.N; i++ {
		if p.Buf[i] != byte(seq)+byte(i) {
			t.Fatalf("packet %d: byte %d is %#x, want %#x", seq, i, p.Buf[i], byte(seq)+byte(i))
		}
	}
}

// slots returns n receive packets with buffers of size bytes.
func slots(n, size int) []Packet {
	pkts := make([]Packet, n)
	for i := range pkts {
		pkts[i].Buf = make([]byte, size)
	}
	return pkts
}

// recvN receives exactly n packets, appending them (copied) to got.
func recvN(t testing.TB, w Wire, n int, rx []Packet) []Packet {
	t.Helper()
	var got []Packet
	for len(got) < n {
		k, err := w.Recv(rx[:min(len(rx), n-len(got))])
		if err != nil {
			t.Fatalf("Recv after %d of %d packets: %v", len(got), n, err)
		}
		for _, p := range rx[:k] {
			got = append(got, Packet{Buf: append([]byte(nil), p.Buf[:p.N]...), N: p.N, Addr: p.Addr})
		}
	}
	return got
}

func TestFaultsNormalize(t *testing.T) {
	nan := 0.0
	nan /= nan
	f := Faults{Loss: -1, Duplicate: 2, Reorder: nan, Delay: -5, Jitter: -1}.normalize()
	if f.Loss != 0 || f.Duplicate != 1 || f.Reorder != 0 || f.Delay != 0 || f.Jitter != 0 {
		t.Errorf("normalize = %+v", f)
	}
	if !f.active() || f.timed() {
		t.Errorf("%+v: active %v, timed %v", f, f.active(), f.timed())
	}
	if (Faults{Seed: 1}).active() {
		t.Error("a seed alone is active")
	}
}

func TestStatsDropped(t *testing.T) {
	s := Stats{DropTruncated: 1, DropOversize: 2, DropUnknown: 3, DropQueueFull: 4, DropLoss: 5, DropClosed: 6, TxPackets: 100}
	if got := s.Dropped(); got != 21 {
		t.Errorf("Dropped = %d, want 21", got)
	}
}
