package engine

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// TestBundles: messages an Auto vconn's sender queues faster than they go
// out travel in bundles, copied or gathered, and each arrives whole, once,
// in order, with its immediate; no buffer is left behind. The fixed
// transports never bundle.
func TestBundles(t *testing.T) {
	for _, tr := range []Transport{RC, Auto, UC} {
		t.Run(tr.String(), func(t *testing.T) {
			ctx, a, b, va, vb := testPair(t, wire.Faults{}, tr, 30*time.Second)
			const n = 5000
			size := func(i int) int {
				if i%3 == 0 {
					return gatherMin + i%3000 // gathered, not copied
				}
				return 1 + i%700
			}
			go sendNumbered(ctx, t, va, n, size)
			if tr != Auto {
				defer func() {
					if s := a.Stats(); s.Bundled != 0 {
						t.Errorf("a %v vconn bundled %d messages", tr, s.Bundled)
					}
				}()
			}
			if tr == UC {
				// Datagrams may be lost: count what comes, in order.
				last := -1
				for {
					rctx, rcancel := context.WithTimeout(ctx, 500*time.Millisecond)
					m, err := vb.Recv(rctx)
					rcancel()
					if err != nil {
						break
					}
					i := int(m.Imm)
					if i <= last || len(m.Data) != size(i) || m.Data[0] != byte(i) {
						t.Fatalf("after message %d came %d with %d bytes", last, i, len(m.Data))
					}
					last = i
					m.Release()
				}
				return
			}
			recvNumbered(ctx, t, vb, n, size)
			s := a.Stats()
			if tr == Auto && (s.Bundled == 0 || s.Gathered == 0 || s.Gathered == s.Bundled) {
				t.Fatalf("%d messages bundled, %d of them gathered: want both kinds of bundle", s.Bundled, s.Gathered)
			}
			t.Logf("%d of %d messages bundled, %d gathered", s.Bundled, n, s.Gathered)
			waitFor(t, func() bool { return a.Stats().MsgsSent == n }, "every message counted sent once")
			// No receive buffer is still held by a bundle's messages.
			for _, ci := range []int{b.recvClass, b.dgramClass} {
				for i := range b.pool.classes[ci].refs {
					if r := b.pool.classes[ci].refs[i].Load(); r != 0 {
						t.Fatalf("receive buffer %d of class %d still has %d owners", i, ci, r)
					}
				}
			}
			closeAll(t, a, b, va, vb)
		})
	}
}

// bundleBytes builds a bundle of the given payloads, numbered from seq.
func bundleBytes(seq uint32, payloads ...[]byte) (header, []byte) {
	var body []byte
	for i, p := range payloads {
		var rh [headerLen]byte
		(&header{typ: msgData, flags: flagFirst | flagLast, length: uint32(len(p)), seq: seq + uint32(i)}).put(rh[:])
		body = append(append(body, rh[:]...), p...)
	}
	return header{typ: msgBundle, flags: flagFirst | flagLast, length: uint32(len(body)), seq: seq, imm: uint32(len(payloads))}, body
}

func TestCheckBundleRejects(t *testing.T) {
	good := func() (header, []byte) { return bundleBytes(7, []byte("one"), []byte("two!"), nil) }
	h, b := good()
	if err := checkBundle(&h, b); err != nil {
		t.Fatalf("a good bundle: %v", err)
	}
	var got []string
	eachBundled(b, func(rh header, d []byte) { got = append(got, string(d)) })
	if len(got) != 3 || got[1] != "two!" || got[2] != "" {
		t.Fatalf("a good bundle's messages: %q", got)
	}
	for name, mutate := range map[string]func(h *header, b []byte) []byte{
		"one message":       func(h *header, b []byte) []byte { h.imm = 1; return b },
		"count too high":    func(h *header, b []byte) []byte { h.imm = 4; return b },
		"count too low":     func(h *header, b []byte) []byte { h.imm = 2; return b },
		"over the ring":     func(h *header, b []byte) []byte { h.imm = maxBundle + 1; return b },
		"length off":        func(h *header, b []byte) []byte { h.length++; return b },
		"truncated":         func(h *header, b []byte) []byte { h.length--; return b[:len(b)-1] },
		"seq gap":           func(h *header, b []byte) []byte { binary.BigEndian.PutUint32(b[headerLen+3+12:], 99); return b },
		"chunk inside":      func(h *header, b []byte) []byte { b[1] = flagFirst; return b },
		"control inside":    func(h *header, b []byte) []byte { b[0] = byte(msgCredit); return b },
		"record past end":   func(h *header, b []byte) []byte { binary.BigEndian.PutUint32(b[8:], 1000); return b },
		"trailing garbage":  func(h *header, b []byte) []byte { h.length += 3; return append(b, 1, 2, 3) },
		"bad record header": func(h *header, b []byte) []byte { b[2] = 1; return b },
	} {
		h, b := good()
		b = mutate(&h, b)
		if err := checkBundle(&h, b); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzBundle: checkBundle never panics, and what it accepts are messages
// that fill the payload.
func FuzzBundle(f *testing.F) {
	h, b := bundleBytes(3, []byte("a"), []byte("bc"))
	f.Add(h.seq, h.imm, b)
	h, b = bundleBytes(^uint32(0), make([]byte, 100), nil, []byte{1})
	f.Add(h.seq, h.imm, b)
	f.Fuzz(func(t *testing.T, seq, count uint32, b []byte) {
		h := header{typ: msgBundle, flags: flagFirst | flagLast, length: uint32(len(b)), seq: seq, imm: count}
		if checkBundle(&h, b) != nil {
			return
		}
		total, k := 0, uint32(0)
		eachBundled(b, func(rh header, d []byte) {
			if rh.seq != seq+k || int(rh.length) != len(d) {
				t.Fatalf("message %d: seq %d, %d bytes for length %d", k, rh.seq, len(d), rh.length)
			}
			total += headerLen + len(d)
			k++
		})
		if k != count || total != len(b) {
			t.Fatalf("accepted %d of %d messages over %d of %d bytes", k, count, total, len(b))
		}
	})
}

// TestBundleCredits: a bundle takes one receive credit, as it takes one
// receive buffer, and the credit comes back once, with the buffer, after
// the last of its messages is released. With a small fixed window the
// sender runs out of credits, queues, and bundles more messages per credit;
// every credit it took comes back, and nothing overran the receive buffers
// (no datagram was lost, so no gap was reported).
func TestBundleCredits(t *testing.T) {
	a, b := testEngines(t, wire.Faults{}, Config{Credits: 4, DgramBuffers: 16})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	va, vb, err := Pair(ctx, a, b, VConnOptions{Transport: Auto}, VConnOptions{Transport: Auto})
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	size := func(i int) int { return 1 + i%700 }
	go sendNumbered(ctx, t, va, n, size)
	recvNumbered(ctx, t, vb, n, size)
	s := a.Stats()
	// The engines stop their pollers on Close: the sender's count of
	// credits taken is then safe to read.
	for _, e := range []*Engine{a, b} {
		if err := e.Close(); err != nil {
			t.Fatal(err)
		}
	}
	taken, returned := va.sent, vb.consumed.Load()
	t.Logf("%d messages, %d bundled, %d credits", n, s.Bundled, taken)
	if s.Bundled == 0 || taken >= n {
		t.Errorf("%d messages took %d credits (%d bundled): want fewer credits than messages", n, taken, s.Bundled)
	}
	if taken != returned {
		t.Errorf("the sender took %d credits, the receiver returned %d", taken, returned)
	}
	// A datagram lost on a lossless fabric was dropped for want of a
	// receive buffer, and the peer reported the gap. (A timeout may
	// resend in vain when the race detector stalls a poller.)
	if s.GapResends != 0 {
		t.Errorf("%d datagrams resent on gap reports on a lossless fabric: the window let the sender overrun the receive buffers", s.GapResends)
	}
}
