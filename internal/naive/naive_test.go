package naive

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// testEndpoints opens two endpoints on soft devices joined by an in-memory
// fabric with faults f. Cleanup closes them and checks that every verbs
// object was released (the devices refuse to close otherwise).
func testEndpoints(t testing.TB, f wire.Faults, cfg Config) (*Endpoint, *Endpoint) {
	t.Helper()
	fb := wire.NewFabric(f)
	t.Cleanup(func() { _ = fb.Close() })
	open := func(ip string) *Endpoint {
		w, err := fb.Attach(verbs.GIDFromAddr(netip.MustParseAddr(ip)))
		if err != nil {
			t.Fatal(err)
		}
		dev, err := soft.Open(soft.Config{Name: ip, Wire: w})
		if err != nil {
			t.Fatal(err)
		}
		e, err := New(dev, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := e.Close(); err != nil {
				t.Errorf("close endpoint: %v", err)
			}
			if err := dev.Close(); err != nil {
				t.Errorf("close device: %v", err)
			}
		})
		return e
	}
	return open("10.9.1.1"), open("10.9.1.2")
}

func TestSendRecv(t *testing.T) {
	a, b := testEndpoints(t, wire.Faults{}, Config{MaxMessage: 8 << 10, RecvDepth: 4, SendDepth: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca, cb, err := Pair(ctx, a, b, ConnOptions{}, ConnOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Inline, from a send buffer, empty and full-sized, and many more than
	// the credit window and the send queue hold.
	sizes := []int{0, 1, 64, 65, 1000, 8 << 10}
	const rounds = 20
	go func() {
		for r := 0; r < rounds; r++ {
			for i, n := range sizes {
				if err := ca.Send(ctx, bytes.Repeat([]byte{byte(r*len(sizes) + i)}, n)); err != nil {
					t.Error(err)
					return
				}
			}
		}
	}()
	for r := 0; r < rounds; r++ {
		for i, n := range sizes {
			m, err := cb.Recv(ctx)
			if err != nil {
				t.Fatalf("round %d message %d: %v", r, i, err)
			}
			want := bytes.Repeat([]byte{byte(r*len(sizes) + i)}, n)
			if !bytes.Equal(m.Data, want) {
				t.Fatalf("round %d message %d: got %d bytes %.8x, want %d bytes of %#x", r, i, len(m.Data), m.Data, n, byte(r*len(sizes)+i))
			}
			m.Release()
		}
	}
	if err := ca.Send(ctx, make([]byte, 8<<10+1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("oversized send: %v, want ErrTooLarge", err)
	}
}

// TestManyConnsHandler sends both ways on many conns with handlers, through
// a lossy fabric, and checks every message arrives once, in order.
func TestManyConnsHandler(t *testing.T) {
	const (
		nconn = 50
		msgs  = 100
	)
	a, b := testEndpoints(t, wire.Faults{Seed: 3, Loss: 0.01, Reorder: 0.01}, Config{Pollers: 2, RecvDepth: 4})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	type seen struct {
		mu   sync.Mutex
		next map[*Conn]uint32
	}
	var got seen
	got.next = make(map[*Conn]uint32)
	var total atomic.Int64
	var bad atomic.Value
	handler := func(c *Conn, m Message) {
		v := uint32(m.Data[0]) | uint32(m.Data[1])<<8
		got.mu.Lock()
		want := got.next[c]
		got.next[c] = want + 1
		got.mu.Unlock()
		if v != want {
			bad.Store(errors.New("out of order"))
		}
		m.Release()
		total.Add(1)
	}
	var conns []*Conn
	for i := 0; i < nconn; i++ {
		ca, cb, err := Pair(ctx, a, b, ConnOptions{Handler: handler}, ConnOptions{Handler: handler})
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, ca, cb)
	}
	var wg sync.WaitGroup
	for _, c := range conns {
		wg.Go(func() {
			buf := make([]byte, 100)
			for i := 0; i < msgs; i++ {
				buf[0], buf[1] = byte(i), byte(i>>8)
				if err := c.Send(ctx, buf); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for total.Load() < 2*nconn*msgs {
		if ctx.Err() != nil {
			t.Fatalf("received %d of %d messages", total.Load(), 2*nconn*msgs)
		}
		time.Sleep(time.Millisecond)
	}
	if err, _ := bad.Load().(error); err != nil {
		t.Fatal(err)
	}
	if s := a.Stats(); s.Conns != nconn || s.QPs != nconn || s.CQs != nconn || s.RegisteredBytes == 0 {
		t.Fatalf("stats %+v", s)
	}
}

// TestCloseReleasesEverything closes conns from both the application and
// the endpoint, then checks that the devices close (no QP, CQ, MR or PD
// left) and that the pollers' goroutines are gone.
func TestCloseReleasesEverything(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Run("close", func(t *testing.T) {
		a, b := testEndpoints(t, wire.Faults{}, Config{Pollers: 2})
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var conns []*Conn
		for i := 0; i < 20; i++ {
			ca, cb, err := Pair(ctx, a, b, ConnOptions{}, ConnOptions{})
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, ca, cb)
			if err := ca.Send(ctx, []byte("hello")); err != nil {
				t.Fatal(err)
			}
		}
		// A blocked Recv and a blocked Send end when their conn closes.
		errs := make(chan error, 2)
		go func() { _, err := conns[2].Recv(ctx); errs <- err }()
		go func() {
			for {
				if err := conns[4].Send(ctx, []byte("x")); err != nil {
					errs <- err
					return
				}
			}
		}()
		time.Sleep(10 * time.Millisecond)
		for _, c := range conns[:len(conns)/2] {
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
		}
		for range 2 {
			if err := <-errs; !errors.Is(err, ErrClosed) {
				t.Fatalf("blocked call: %v, want ErrClosed", err)
			}
		}
		deadline := time.Now().Add(5 * time.Second)
		for a.Stats().Conns+b.Stats().Conns != len(conns)/2 {
			if time.Now().After(deadline) {
				t.Fatalf("closed conns not destroyed: %+v %+v", a.Stats(), b.Stats())
			}
			time.Sleep(time.Millisecond)
		}
		if err := conns[0].Send(ctx, []byte("x")); !errors.Is(err, ErrClosed) {
			t.Fatalf("send after close: %v", err)
		}
		// The rest are closed by the endpoints' Close in cleanup.
	})
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSendAllocatesNothing: a steady-state send, and its receipt by a
// handler that releases at once, allocate nothing.
func TestSendAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	a, b := testEndpoints(t, wire.Faults{}, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var got atomic.Int64
	ca, _, err := Pair(ctx, a, b, ConnOptions{}, ConnOptions{Handler: func(_ *Conn, m Message) { m.Release(); got.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	small, large := make([]byte, 64), make([]byte, 4096)
	for range 1000 { // warm up: slices grow to their steady size
		if err := ca.Send(ctx, small); err != nil {
			t.Fatal(err)
		}
	}
	for _, msg := range [][]byte{small, large} {
		if n := testing.AllocsPerRun(1000, func() {
			if err := ca.Send(ctx, msg); err != nil {
				t.Fatal(err)
			}
		}); n != 0 {
			t.Errorf("send of %d bytes: %.2f allocations", len(msg), n)
		}
	}
}

// TestWindow sends on many more connections than the endpoint's window
// holds, through a lossy fabric: every message arrives (no share of the
// window is stranded on a connection that stopped sending), and once all
// have completed every token is back.
func TestWindow(t *testing.T) {
	const (
		nconn  = 40
		msgs   = 50
		window = 8
	)
	a, b := testEndpoints(t, wire.Faults{Seed: 5, Loss: 0.01}, Config{Window: window})
	if got := a.Config().SignalEvery; got != 1 {
		t.Fatalf("SignalEvery with a window: %d, want 1", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var total atomic.Int64
	count := func(_ *Conn, m Message) { m.Release(); total.Add(1) }
	var senders []*Conn
	for i := 0; i < nconn; i++ {
		ca, _, err := Pair(ctx, a, b, ConnOptions{}, ConnOptions{Handler: count})
		if err != nil {
			t.Fatal(err)
		}
		senders = append(senders, ca)
	}
	var wg sync.WaitGroup
	for _, c := range senders {
		wg.Go(func() {
			for i := 0; i < msgs; i++ {
				if err := c.Send(ctx, []byte{byte(i)}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	for total.Load() < nconn*msgs || len(a.window) > 0 {
		if ctx.Err() != nil {
			t.Fatalf("received %d of %d messages; %d window tokens still held", total.Load(), nconn*msgs, len(a.window))
		}
		time.Sleep(time.Millisecond)
	}
}
