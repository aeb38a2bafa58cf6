package engine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/engine/reliable"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// testEngines starts two engines on soft devices joined by an in-memory
// fabric with faults f. Without faults, in a binary built with -tags
// ibverbs run in hack/rxe-vm (RDMAVISOR_RXE_VM=1), both engines open the
// kernel's rxe0 instead (rxe_test.go): one device, whose QPs reach each
// other over its loopback.
func testEngines(t testing.TB, f softwire.Faults, cfg Config) (*Engine, *Engine) {
	t.Helper()
	if openVerbsDevice != nil && f == (softwire.Faults{}) {
		return testEngine(t, openVerbsDevice(t), cfg), testEngine(t, openVerbsDevice(t), cfg)
	}
	fb := softwire.NewFabric(f)
	t.Cleanup(func() { _ = fb.Close() })
	return testEnginesOn(t, fb, cfg)
}

// testPair opens two engines on a fabric with faults f and a vconn pair of
// transport tr between them, and a context that ends after timeout.
func testPair(t *testing.T, f softwire.Faults, tr transport.Kind, timeout time.Duration) (context.Context, *Engine, *Engine, *VConn, *VConn) {
	t.Helper()
	a, b := testEngines(t, f, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: tr}, VConnOptions{Transport: tr})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, a, b, va, vb
}

// testEnginesOn opens two engines on fabric fb, their devices passed
// through wrap if given (a device that behaves as some NIC does).
func testEnginesOn(t testing.TB, fb *softwire.Fabric, cfg Config, wrap ...func(verbs.Device) verbs.Device) (*Engine, *Engine) {
	t.Helper()
	open := func(ip string) *Engine {
		w, err := fb.Attach(verbs.GIDFromAddr(netip.MustParseAddr(ip)))
		if err != nil {
			t.Fatal(err)
		}
		dev, err := soft.Open(soft.Config{Name: ip, Wire: w})
		if err != nil {
			t.Fatal(err)
		}
		return testEngine(t, dev, cfg, wrap...)
	}
	return open("10.9.0.1"), open("10.9.0.2")
}

// openVerbsDevice, when set (rxe_test.go), opens a device of a real verbs
// backend for testEngines; the test owns it.
var openVerbsDevice func(t testing.TB) verbs.Device

// testEngine starts an engine on dev (passed through wrap) and closes
// both when the test ends.
func testEngine(t testing.TB, dev verbs.Device, cfg Config, wrap ...func(verbs.Device) verbs.Device) *Engine {
	t.Helper()
	c := cfg
	c.Device = dev
	for _, w := range wrap {
		c.Device = w(c.Device)
	}
	if c.Log.GetSink() == nil {
		c.Log = testr.NewWithInterface(t, testr.Options{})
	}
	e, err := New(c)
	if err != nil {
		_ = dev.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := e.Close(); err != nil {
			t.Errorf("close engine: %v", err)
		}
		if err := dev.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	return e
}

func TestSendRecv(t *testing.T) {
	a, b := testEngines(t, softwire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sizes := []int{0, 1, 100, 16<<10 - format.HeaderLen, 16 << 10, 100 << 10, 1 << 20}
	go func() {
		for i, n := range sizes {
			msg := bytes.Repeat([]byte{byte(i + 1)}, n)
			if err := va.SendImm(ctx, msg, uint32(i)); err != nil {
				t.Error(err)
				return
			}
		}
		_ = va.Close()
	}()
	for i, n := range sizes {
		m, err := vb.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if len(m.Data) != n || !m.HasImm || m.Imm != uint32(i) || n > 0 && (m.Data[0] != byte(i+1) || m.Data[n-1] != byte(i+1)) {
			t.Fatalf("message %d: got %d bytes imm %v/%d", i, len(m.Data), m.HasImm, m.Imm)
		}
		m.Release()
	}
	if _, err := vb.Recv(ctx); err != io.EOF {
		t.Fatalf("after the peer closed: %v, want EOF", err)
	}
	if err := vb.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 }, "vconns released")
}

func waitFor(t testing.TB, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestManyVConnsUnderLoss(t *testing.T) {
	const (
		nvc  = 10000
		msgs = 5
	)
	a, b := testEngines(t, softwire.Faults{Seed: 7, Loss: 0.02, Reorder: 0.02}, Config{QPsPerPeer: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	got := make([][]uint32, nvc)
	idx := map[*VConn]int{}
	senders := make([]*VConn, nvc)
	done := make(chan struct{}, 1)
	total := 0
	handler := func(vc *VConn, m Message) {
		i := idx[vc]
		got[i] = append(got[i], m.Imm)
		if string(m.Data) != fmt.Sprintf("vconn %d message %d", i, m.Imm) {
			t.Errorf("vconn %d got %q", i, m.Data)
		}
		m.Release()
		total++
		if total == nvc*msgs {
			done <- struct{}{}
		}
	}
	for i := range senders {
		va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{Handler: handler})
		if err != nil {
			t.Fatal(err)
		}
		senders[i] = va
		idx[vb] = i
	}
	if s := a.Stats(); s.QPs != 4 {
		t.Fatalf("%d vconns use %d QPs, want 4", nvc, s.QPs)
	}
	for j := 0; j < msgs; j++ {
		for i, va := range senders {
			if err := va.SendImm(ctx, []byte(fmt.Sprintf("vconn %d message %d", i, j)), uint32(j)); err != nil {
				t.Fatal(err)
			}
		}
	}
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatalf("delivered %d of %d", total, nvc*msgs)
	}
	for i, g := range got {
		if len(g) != msgs {
			t.Fatalf("vconn %d got %d messages, want %d", i, len(g), msgs)
		}
		for j, imm := range g {
			if imm != uint32(j) {
				t.Fatalf("vconn %d: message %d arrived as %d-th", i, imm, j)
			}
		}
	}
	t.Logf("a: %+v", a.Stats())
	dumpPeers(t, a)
	dumpPeers(t, b)
}

func dumpPeers(t testing.TB, e *Engine) {
	for _, p := range e.peers {
		p.mu.Lock()
		t.Logf("engine %v peer %v qps %v ingress %d", e.gid, p.gid, p.qps, len(p.ingress))
		p.mu.Unlock()
	}
}

func TestOneSided(t *testing.T) {
	a, b := testEngines(t, softwire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vc2a, vc2b, err := Pair(ctx, a, b, VConnOptions{}, VConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// b exports a 100 KiB region to vb's peer (va) only.
	r, err := vb.Export(ctx, 100<<10, AccessRead|AccessWrite, nil)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := vb.Export(ctx, 4096, AccessRead, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Tell the peer, in order after the exports.
	if err := vb.Send(ctx, []byte("regions ready")); err != nil {
		t.Fatal(err)
	}
	m, err := va.Recv(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m.Release()
	// Both providers have type 2 windows: the exports are zero-based
	// windows, not the MRs' keys.
	if !b.windows {
		t.Fatalf("device %s has no memory windows", b.dev.Attr().Name)
	}
	rg := va.rg()
	rg.mu.Lock()
	ad := rg.remote[r.ID()]
	rg.mu.Unlock()
	if ad.Addr != 0 || ad.RKey == r.mr.RKey() {
		t.Fatalf("export %+v: want a zero-based window, not the MR's key %#x", ad, r.mr.RKey())
	}

	data := bytes.Repeat([]byte("0123456789abcdef"), 3000) // 48000 bytes: three chunks
	if err := va.Write(ctx, r.ID(), 1000, data); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Bytes()[1000:1000+len(data)], data) {
		t.Fatal("RDMA write did not land")
	}
	copy(ro.Bytes(), "read-only region")
	got := make([]byte, 16)
	if err := va.Read(ctx, ro.ID(), 0, got); err != nil || string(got) != "read-only region" {
		t.Fatalf("read: %q, %v", got, err)
	}
	back := make([]byte, len(data))
	if err := va.Read(ctx, r.ID(), 1000, back); err != nil || !bytes.Equal(back, data) {
		t.Fatalf("read back: %v", err)
	}
	for _, tc := range []struct {
		name string
		err  error
		op   func() error
	}{
		{"write to a read-only region", ErrRegionAccess, func() error { return va.Write(ctx, ro.ID(), 0, []byte("x")) }},
		{"write past the end", ErrRegionAccess, func() error { return va.Write(ctx, r.ID(), 100<<10-1, []byte("xy")) }},
		{"read past the end", ErrRegionAccess, func() error { return va.Read(ctx, ro.ID(), 4000, make([]byte, 97)) }},
		{"unknown region", ErrNoRegion, func() error { return va.Write(ctx, 99, 0, []byte("x")) }},
		// The region is exported to vb's peer, not to this other vconn.
		{"another vconn", ErrNoRegion, func() error { return vc2a.Write(ctx, r.ID(), 0, []byte("x")) }},
	} {
		if err := tc.op(); !errors.Is(err, tc.err) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.err)
		}
	}
	// Unexport: the peer confirms, then the memory is deregistered; the
	// region is refused afterwards.
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return errors.Is(va.Write(ctx, r.ID(), 0, []byte("x")), ErrNoRegion) }, "the unexport to reach the peer")
	if va.Err() != nil || vb.Err() != nil || vc2a.Err() != nil || vc2b.Err() != nil {
		t.Fatalf("a refused operation broke a vconn: %v %v %v %v", va.Err(), vb.Err(), vc2a.Err(), vc2b.Err())
	}
}

func TestTransports(t *testing.T) {
	for _, tr := range []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto} {
		t.Run(tr.String(), func(t *testing.T) {
			ctx, a, b, va, vb := testPair(t, softwire.Faults{}, tr, 10*time.Second)
			max := va.MaxMessage()
			for i, n := range []int{0, 1, 200, min(max, 3000), max} {
				msg := bytes.Repeat([]byte{byte(i + 1)}, n)
				if err := va.SendImm(ctx, msg, uint32(i)); err != nil {
					t.Fatal(err)
				}
				m, err := vb.Recv(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(m.Data, msg) || m.Imm != uint32(i) {
					t.Fatalf("message %d: %d bytes, imm %d", i, len(m.Data), m.Imm)
				}
				m.Release()
			}
			if err := va.Send(ctx, make([]byte, max+1)); !errors.Is(err, ErrTooLarge) {
				t.Fatalf("a %d-byte message on a %v vconn: %v", max+1, tr, err)
			}
			// Back the other way, then close both.
			if err := vb.Send(ctx, []byte("pong")); err != nil {
				t.Fatal(err)
			}
			if m, err := va.Recv(ctx); err != nil || string(m.Data) != "pong" {
				t.Fatalf("reply: %q %v", m.Data, err)
			}
			_ = va.Close()
			_ = vb.Close()
			waitFor(t, func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 }, "vconns released")
		})
	}
}

// TestAutoReliableUnderLoss: an Auto vconn mixes datagrams (messages of
// up to a chunk, over UC) and RC (longer ones) and still delivers every
// message exactly once and in order when the network loses, duplicates
// and reorders packets; losses followed by later arrivals are resent on
// the receiver's gap report, not after a timeout.
func TestAutoReliableUnderLoss(t *testing.T) {
	ctx, a, b, va, vb := testPair(t, softwire.Faults{Seed: 11, Loss: 0.05, Duplicate: 0.02, Reorder: 0.05}, transport.Auto, 60*time.Second)
	const n = 3000
	size := func(i int) int {
		switch i % 10 {
		case 0:
			return 17000 + i // longer than a chunk: RC
		case 5:
			return 5000 + i // a datagram of two packets
		}
		return 8 + i%500
	}
	go sendNumbered(ctx, t, va, n, size)
	recvNumbered(ctx, t, vb, n, size)
	s := a.Stats()
	if s.Retransmits == 0 {
		t.Fatal("no datagram was retransmitted under 5% loss: the datagram path was not exercised")
	}
	if s.GapResends == 0 {
		t.Error("no datagram was resent on a gap report: every loss waited for the timeout")
	}
	if s.UCQPs == 0 {
		t.Error("the Auto vconn opened no UC QP for its datagrams")
	}
	t.Logf("sender: %d retransmissions, %d on gap reports", s.Retransmits, s.GapResends)
	closeAll(t, a, b, va, vb)
}

// TestAutoLongMessages: an Auto vconn's long messages (several chunks)
// travel on RC whole, interleaved in order with datagram-sized ones.
func TestAutoLongMessages(t *testing.T) {
	ctx, _, _, va, vb := testPair(t, softwire.Faults{}, transport.Auto, 20*time.Second)
	sizes := []int{16 << 10, 16<<10 - format.HeaderLen + 1, 10, 64 << 10, 100, 256 << 10, 1 << 20}
	size := func(i int) int { return sizes[i] }
	go sendNumbered(ctx, t, va, len(sizes), size)
	recvNumbered(ctx, t, vb, len(sizes), size)
}

// TestAutoAcksOnlyDatagrams: messages an Auto vconn sends over RC (longer
// than a chunk) need no acknowledgement of the engine's own: RC delivered
// them, and the sender keeps nothing. A few of them, fewer than take half
// the credit window, make the receiver send nothing at all.
func TestAutoAcksOnlyDatagrams(t *testing.T) {
	ctx, _, b, va, vb := testPair(t, softwire.Faults{}, transport.Auto, 20*time.Second)
	before := b.Stats().WRsPosted
	const n = 5 // 2 chunks, so 2 credits, each: under half of defaultCredits
	size := func(int) int { return 20000 }
	go sendNumbered(ctx, t, va, n, size)
	recvNumbered(ctx, t, vb, n, size)
	time.Sleep(20 * reliable.AckDelay)
	if sent := b.Stats().WRsPosted - before; sent != 0 {
		t.Errorf("the receiver of %d long messages posted %d work requests: want none (no grant due, no datagram to acknowledge)", n, sent)
	}
}

// TestAutoDelayedAcks: a receiver acknowledges Auto datagrams cumulatively
// (with its credit grants, or after reliable.AckDelay, not once per message),
// and a tail that brings no grant is still acknowledged: no buffer held,
// and no retransmission, for the timeout follows the measured round trip.
//
// A retransmission on a lossless fabric is then the host's doing: a poller
// or a goroutine of the soft device stalled past the timeout's floor (25 ms
// on a path without gap reports, reliable.MinRTO; 5 ms before).
// The race detector stalls goroutines for milliseconds; rxe in the rxe VM,
// whose emulated CPUs stall the guest's pollers and rxe's own tasklets,
// retransmitted 3 to 71 of 1603, with every message received once and no
// gap reported; a host with more runnable threads than cores (8 on 2), 2 in
// 20 runs. A retransmission the acknowledgements' delay caused would come
// in every run: so without the race detector, on the soft fabric (the
// second pass of hack/test.sh), one of five runs must have none.
func TestAutoDelayedAcks(t *testing.T) {
	const tries = 5
	for try := 1; ; try++ {
		a, b := delayedAcks(t)
		rtx := a.Stats().Retransmits
		if rtx == 0 {
			return
		}
		t.Logf("run %d: %d retransmissions, %d of them on a gap report (sender %+v, receiver %+v)", try, rtx, a.Stats().GapResends, a.Stats(), b.Stats())
		if raceEnabled || openVerbsDevice != nil {
			return
		}
		if try == tries {
			t.Fatalf("retransmissions on a lossless fabric in each of %d runs", tries)
		}
	}
}

// delayedAcks sends 1603 datagrams on a fresh Auto pair, receives them,
// and checks that every send buffer comes back and that the receiver
// acknowledged them in few control messages; it returns the sender and
// the receiver.
func delayedAcks(t *testing.T) (*Engine, *Engine) {
	t.Helper()
	ctx, a, b, va, vb := testPair(t, softwire.Faults{}, transport.Auto, 20*time.Second)
	before := b.Stats().WRsPosted
	const n = 1603 // not a multiple of the half window: a tail is left
	go func() {
		for i := 0; i < n; i++ {
			if err := va.Send(ctx, []byte("datagram")); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for i := 0; i < n; i++ {
		m, err := vb.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		m.Release()
	}
	// Every buffer the sender used is back once all is acknowledged.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		in := a.Stats().BuffersInUse
		left := in[0] + in[1] + in[2]
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d send buffers still held: datagrams never acknowledged", left)
		}
	}
	// Per message acknowledgements would be n control messages.
	if ctl := b.Stats().WRsPosted - before; ctl > n/8 {
		t.Errorf("the receiver posted %d control messages for %d datagrams", ctl, n)
	}
	return a, b
}

// closeAll closes a vconn pair and waits until both engines released it
// and a, the sender, has every send buffer back.
func closeAll(t *testing.T, a, b *Engine, va, vb *VConn) {
	t.Helper()
	_ = va.Close()
	_ = vb.Close()
	waitFor(t, func() bool { return a.Stats().VConns == 0 && b.Stats().VConns == 0 }, "vconns released")
	waitFor(t, func() bool {
		in := a.Stats().BuffersInUse
		return in[0]+in[1]+in[2] == 0
	}, "send buffers returned")
}

// sendNumbered sends n messages on vc: message i has size(i) bytes, all i,
// and immediate i. It reports errors with t.Error, so it may run in its
// own goroutine.
func sendNumbered(ctx context.Context, t *testing.T, vc *VConn, n int, size func(int) int) {
	for i := 0; i < n; i++ {
		if err := vc.SendImm(ctx, bytes.Repeat([]byte{byte(i)}, size(i)), uint32(i)); err != nil {
			t.Error(err)
			return
		}
	}
}

// recvNumbered receives what sendNumbered sent: each message once, whole,
// in order.
func recvNumbered(ctx context.Context, t *testing.T, vc *VConn, n int, size func(int) int) {
	t.Helper()
	for i := 0; i < n; i++ {
		m, err := vc.Recv(ctx)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if m.Imm != uint32(i) || !m.HasImm || len(m.Data) != size(i) || m.Data[0] != byte(i) || m.Data[len(m.Data)-1] != byte(i) {
			t.Fatalf("message %d arrived as imm %d with %d bytes", i, m.Imm, len(m.Data))
		}
		m.Release()
	}
}
