package wire

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"
)

func attach(t testing.TB, fb *Fabric, g ...[16]byte) []Wire {
	t.Helper()
	ws := make([]Wire, len(g))
	for i, gid := range g {
		w, err := fb.Attach(gid)
		if err != nil {
			t.Fatal(err)
		}
		ws[i] = w
	}
	return ws
}

func TestFabricDelivery(t *testing.T) {
	fb := NewFabric(Faults{})
	defer fb.Close()
	ws := attach(t, fb, gidA, gidB, gidC)
	a, b, c := ws[0], ws[1], ws[2]
	if a.LocalGID() != gidA {
		t.Errorf("LocalGID = %v, want %v", a.LocalGID(), gidA)
	}

	for _, size := range []int{0, 1, 64, smallBuf, smallBuf + 1, 1024, MaxPacketLen} {
		pkts := mkPkts(64, size, gidB, 0)
		// Interleave destinations: every third packet goes to c.
		for i := range pkts {
			if i%3 == 0 {
				pkts[i].Addr = gidC
			}
		}
		if n, err := a.Send(pkts); n != len(pkts) || err != nil {
			t.Fatalf("Send = %d, %v", n, err)
		}
		rx := slots(64, MaxPacketLen)
		gotB := recvN(t, b, 42, rx)
		gotC := recvN(t, c, 22, rx)
		for _, got := range [][]Packet{gotB, gotC} {
			for i := range got {
				if got[i].Addr != gidA {
					t.Fatalf("source %v, want %v", got[i].Addr, gidA)
				}
				if size >= 4 {
					checkPayload(t, &got[i], size)
				}
			}
		}
		if size >= 4 {
			// Per destination, packets arrive in the order sent.
			for i := 1; i < len(gotB); i++ {
				if seqOf(&gotB[i]) <= seqOf(&gotB[i-1]) {
					t.Fatalf("size %d: out of order: %d after %d", size, seqOf(&gotB[i]), seqOf(&gotB[i-1]))
				}
			}
		}
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.TxPackets != 7*64 || sb.RxPackets != 7*42 || sa.Dropped() != 0 || sb.Dropped() != 0 {
		t.Errorf("stats a %+v, b %+v", sa, sb)
	}
	if s := fb.Stats(); s.TxPackets != 7*64 || s.RxPackets != 7*64 || s.TxBytes != s.RxBytes {
		t.Errorf("fabric stats %+v", s)
	}
}

func TestFabricAttach(t *testing.T) {
	fb := NewFabric(Faults{})
	a := attach(t, fb, gidA)[0]
	if _, err := fb.Attach(gidA); !errors.Is(err, ErrGIDInUse) {
		t.Errorf("second Attach: %v, want ErrGIDInUse", err)
	}
	a.Close()
	a2, err := fb.Attach(gidA) // free again once closed
	if err != nil {
		t.Fatalf("Attach after Close: %v", err)
	}
	a2.Close()
	fb.Close()
	if _, err := fb.Attach(gidB); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Attach after fabric Close: %v", err)
	}
	if err := fb.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestFabricUnknownDestination(t *testing.T) {
	fb := NewFabric(Faults{})
	defer fb.Close()
	ws := attach(t, fb, gidA, gidB)
	a, b := ws[0], ws[1]
	pkts := mkPkts(10, 100, gidC, 0)
	pkts[4].Addr = gidB
	if n, err := a.Send(pkts); n != 10 || err != nil {
		t.Fatalf("Send = %d, %v; want 10, nil (a lost packet is not an error)", n, err)
	}
	got := recvN(t, b, 1, slots(4, MaxPacketLen))
	if seqOf(&got[0]) != 4 {
		t.Errorf("got packet %d, want 4", seqOf(&got[0]))
	}
	if s := a.Stats(); s.DropUnknown != 9 || s.TxPackets != 1 {
		t.Errorf("stats %+v, want 9 unknown, 1 sent", s)
	}
	// A destination that closes is unknown from then on.
	b.Close()
	a.Send(pkts[4:5])
	if s := a.Stats(); s.DropUnknown != 10 {
		t.Errorf("DropUnknown = %d after the destination closed, want 10", s.DropUnknown)
	}
}

func TestFabricOversizeTruncated(t *testing.T) {
	fb := NewFabric(Faults{})
	defer fb.Close()
	ws := attach(t, fb, gidA, gidB)
	a, b := ws[0], ws[1]

	big := mkPkts(1, MaxPacketLen+1, gidB, 0)
	small := mkPkts(3, 100, gidB, 1)
	small[1].N = 1000 // longer than the receiver's 500-byte buffers
	small[1].Buf = make([]byte, 1000)
	fill(&small[1], 2)
	if n, err := a.Send(append(big, small...)); n != 4 || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if s := a.Stats(); s.DropOversize != 1 || s.TxPackets != 3 {
		t.Errorf("sender stats %+v", s)
	}
	rx := slots(8, 500)
	n, err := b.Recv(rx)
	if err != nil || n != 2 {
		t.Fatalf("Recv = %d, %v; want the 2 packets that fit", n, err)
	}
	if seqOf(&rx[0]) != 1 || seqOf(&rx[1]) != 3 {
		t.Errorf("got %d, %d; want 1, 3", seqOf(&rx[0]), seqOf(&rx[1]))
	}
	if s := b.Stats(); s.DropTruncated != 1 || s.RxPackets != 2 {
		t.Errorf("receiver stats %+v", s)
	}
}

func TestFabricQueueOverflow(t *testing.T) {
	fb := NewFabric(Faults{})
	defer fb.Close()
	ws := attach(t, fb, gidA, gidB)
	a, b := ws[0], ws[1]
	const sent = RxQueueLen + 904
	pkts := mkPkts(64, 64, gidB, 0)
	for i := 0; i < sent; i += len(pkts) {
		k := min(len(pkts), sent-i)
		for j := range k {
			fill(&pkts[j], uint32(i+j))
		}
		if n, err := a.Send(pkts[:k]); n != k || err != nil {
			t.Fatalf("Send = %d, %v", n, err) // never blocks, never fails
		}
	}
	if s := b.Stats(); s.DropQueueFull != sent-RxQueueLen {
		t.Errorf("DropQueueFull = %d, want %d", s.DropQueueFull, sent-RxQueueLen)
	}
	got := recvN(t, b, RxQueueLen, slots(64, 64))
	for i := range got {
		if seqOf(&got[i]) != uint32(i) {
			t.Fatalf("packet %d is %d: the queue keeps the first ones", i, seqOf(&got[i]))
		}
	}
	// The queue drained; new packets are accepted again.
	a.Send(pkts[:1])
	recvN(t, b, 1, slots(1, 64))
	if s := fb.Stats(); s.TxPackets != s.RxPackets+s.DropQueueFull {
		t.Errorf("fabric stats do not add up: %+v", s)
	}
}

func TestFabricClose(t *testing.T) {
	fb := NewFabric(Faults{})
	defer fb.Close()
	ws := attach(t, fb, gidA, gidB)
	a, b := ws[0], ws[1]

	errc := make(chan error)
	go func() {
		_, err := b.Recv(slots(4, 64))
		errc <- err
	}()
	time.Sleep(10 * time.Millisecond) // let it block
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("blocked Recv returned %v, want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock Recv")
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := b.Recv(slots(1, 64)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Recv after Close: %v", err)
	}
	if _, err := b.Send(mkPkts(1, 64, gidA, 0)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Send after Close: %v", err)
	}

	// Packets queued at Close are dropped and counted.
	c := attach(t, fb, gidC)[0]
	a.Send(mkPkts(5, 64, gidC, 0))
	c.Close()
	if s := c.Stats(); s.DropClosed != 5 {
		t.Errorf("DropClosed = %d, want 5", s.DropClosed)
	}
}

func TestFabricConcurrent(t *testing.T) {
	fb := NewFabric(Faults{Seed: 3, Loss: 0.01, Duplicate: 0.01, Reorder: 0.05, Delay: 50 * time.Microsecond, Jitter: 50 * time.Microsecond})
	defer fb.Close() // on failure; Close is idempotent
	ws := attach(t, fb, gidA, gidB, gidC)
	const perSender = 2000
	var wg sync.WaitGroup
	for _, s := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			pkts := mkPkts(8, 200, gidA, 0)
			for i := 0; i < perSender; i += len(pkts) {
				for j := range pkts {
					pkts[j].Addr = ws[(i/8+j)%3].LocalGID()
				}
				if _, err := s.Send(pkts); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	var rwg sync.WaitGroup
	for _, r := range ws {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			rx := slots(16, MaxPacketLen)
			for {
				k, err := r.Recv(rx)
				if err != nil {
					return
				}
				for i := range rx[:k] {
					checkPayload(t, &rx[i], 200)
				}
			}
		}()
	}
	wg.Wait()
	// Every packet and copy is delivered or dropped once the timer
	// goroutine has released the delayed and held ones; on a loaded machine
	// that can take far longer than the delays, and closing first would
	// count the rest as DropUnknown (their destinations detached) and
	// deliver none.
	sent := uint64(len(ws) * perSender)
	var s Stats
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		s = fb.Stats()
		if s.TxPackets+s.Dropped() == sent+s.Duplicated {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("packets still in flight after 20 s: %+v", s)
		}
	}
	if s.DropUnknown != 0 || s.TxPackets == 0 {
		t.Errorf("stats %+v", s)
	}
	fb.Close()
	rwg.Wait()
	if s := fb.Stats(); s.TxPackets < s.RxPackets {
		t.Errorf("stats %+v", s)
	}
}

func TestFabricAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, tc := range []struct {
		name string
		f    Faults
	}{
		{"clean", Faults{}},
		{"loss", Faults{Seed: 1, Loss: 0.1}},
		{"loss+dup+reorder", Faults{Seed: 1, Loss: 0.05, Duplicate: 0.05, Reorder: 0.1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fb := NewFabric(tc.f)
			defer fb.Close()
			ws := attach(t, fb, gidA, gidB)
			a, b := ws[0], ws[1]
			for _, batch := range []int{1, 64} {
				pkts := mkPkts(batch, 1024, gidB, 0)
				rx := slots(batch, MaxPacketLen)
				round := func() {
					a.Send(pkts)
					for b.Stats().RxPackets < a.Stats().TxPackets {
						if _, err := b.Recv(rx); err != nil {
							t.Fatal(err)
						}
					}
				}
				for range 200 { // warm the pools, the held-list map and the heap
					round()
				}
				if allocs := testing.AllocsPerRun(500, round); allocs != 0 {
					t.Errorf("batch %d: %v allocations per Send+Recv, want 0", batch, allocs)
				}
			}
		})
	}
}

// TestFabricSetRxQueueLen bounds a receive queue below RxQueueLen, as the
// soft device's NIC model does with its ring: the overflow is dropped.
func TestFabricSetRxQueueLen(t *testing.T) {
	fb := NewFabric(Faults{})
	defer fb.Close()
	ws := attach(t, fb, gidA, gidB)
	a, b := ws[0], ws[1]
	rw := b.(interface{ SetRxQueueLen(int) error })
	for _, bad := range []int{0, -1, RxQueueLen + 1} {
		if err := rw.SetRxQueueLen(bad); err == nil {
			t.Errorf("SetRxQueueLen(%d) accepted", bad)
		}
	}
	const depth, sent = 10, 64
	if err := rw.SetRxQueueLen(depth); err != nil {
		t.Fatal(err)
	}
	pkts := mkPkts(sent, 64, gidB, 0)
	for j := range pkts {
		fill(&pkts[j], uint32(j))
	}
	if n, err := a.Send(pkts); n != sent || err != nil {
		t.Fatalf("Send = %d, %v", n, err)
	}
	if s := b.Stats(); s.DropQueueFull != sent-depth {
		t.Errorf("DropQueueFull = %d, want %d", s.DropQueueFull, sent-depth)
	}
	recvN(t, b, depth, slots(depth, 64))
}
