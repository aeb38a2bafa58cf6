package engine

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
)

// The receiver's check of the numbers of the chunks a peer sends on RC
// (repair.go's inOrder): what lets a QP that replaced a failed one send
// again what the old one may have delivered.

// TestChunkNumbers: a peer's RC data chunk is taken only at its number.
// One marked resent that came already is dropped (the resend after a
// QP replacement); the same chunk unmarked, or one past a missing chunk,
// is no engine's doing (an older engine numbers no chunks): the vconn
// fails, and nothing is delivered twice or past a hole.
func TestChunkNumbers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	chunk := func(no uint32, flags uint8) format.Header {
		d := format.DataHeader(5, no, 0, false)
		d.Flags |= format.FlagFirst | format.FlagLast | flags
		d.Arg = no
		return d
	}
	t.Run("older engine", func(t *testing.T) {
		// One that numbers nothing (its QPRequest says so): its chunks
		// are taken as they come, every one delivered.
		a, h, vc, _, in1 := twoQPPeer(ctx, t, "10.9.0.71")
		vc.peer.numbers.Store(false) // what an older engine's QPRequest leaves
		for _, s := range []string{"first", "secnd", "third"} {
			h.send(in1, a, vc.ID(), chunk(0, 0), []byte(s))
			m, err := vc.Recv(ctx)
			if err != nil || string(m.Data) != s {
				t.Fatalf("received %q, %v; want %q", m.Data, err, s)
			}
			m.Release()
		}
	})
	for _, tc := range []struct {
		name string
		bad  format.Header
	}{
		{"repeated unmarked", chunk(0, 0)},
		{"past a hole", chunk(3, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, h, vc, _, in1 := twoQPPeer(ctx, t, "10.9.0.70")
			h.send(in1, a, vc.ID(), chunk(0, 0), []byte("first"))
			before := a.Stats().ResentDropped
			h.send(in1, a, vc.ID(), chunk(0, format.FlagResent), []byte("again"))
			waitFor(t, func() bool { return a.Stats().ResentDropped == before+1 }, "the resent chunk dropped")
			h.send(in1, a, vc.ID(), chunk(1, format.FlagResent), []byte("secnd"))
			h.send(in1, a, vc.ID(), tc.bad, []byte("wrong"))
			waitFor(t, func() bool { return vc.Err() != nil }, "the vconn to fail")
			if !errors.Is(vc.Err(), errChunkOrder) {
				t.Fatalf("the vconn failed with %v, want errChunkOrder", vc.Err())
			}
			var got []string
			for {
				m, err := vc.Recv(ctx)
				if err != nil {
					break
				}
				got = append(got, string(m.Data))
				m.Release()
			}
			if want := []string{"first", "secnd"}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("delivered %q, want %q", got, want)
			}
		})
	}
}

// TestAutoChunkNumbers: an Auto vconn's data chunk on RC is taken only
// at its number (format.Header.AutoChunkNo), as an RC vconn's: one marked
// resent that came already is dropped, the same unmarked or one past a
// missing chunk fails the vconn; from an engine that numbers nothing
// (ResendsAuto unsaid) chunks are taken as they come.
func TestAutoChunkNumbers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	chunk := func(seq uint32, no uint16, flags uint8) format.Header {
		d := format.DataHeader(5, seq, 0, false)
		d.Flags |= format.FlagFirst | format.FlagLast | flags
		d.Chunk = no
		return d
	}
	auto := VConnOptions{Transport: transport.Auto}
	t.Run("older engine", func(t *testing.T) {
		a, h, vc, _, in1 := twoQPPeer(ctx, t, "10.9.0.73", auto)
		vc.peer.numbersAuto.Store(false)
		for i, s := range []string{"first", "secnd", "third"} {
			h.send(in1, a, vc.ID(), chunk(uint32(i), 0, 0), []byte(s))
			m, err := vc.Recv(ctx)
			if err != nil || string(m.Data) != s {
				t.Fatalf("received %q, %v; want %q", m.Data, err, s)
			}
			m.Release()
		}
	})
	for _, tc := range []struct {
		name string
		bad  format.Header
	}{
		{"repeated unmarked", chunk(1, 1, 0)},
		{"past a hole", chunk(2, 3, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, h, vc, _, in1 := twoQPPeer(ctx, t, "10.9.0.72", auto)
			h.send(in1, a, vc.ID(), chunk(0, 0, 0), []byte("first"))
			before := a.Stats().ResentDropped
			h.send(in1, a, vc.ID(), chunk(0, 0, format.FlagResent), []byte("again"))
			waitFor(t, func() bool { return a.Stats().ResentDropped == before+1 }, "the resent chunk dropped")
			h.send(in1, a, vc.ID(), chunk(1, 1, format.FlagResent), []byte("secnd"))
			h.send(in1, a, vc.ID(), tc.bad, []byte("wrong"))
			waitFor(t, func() bool { return vc.Err() != nil }, "the vconn to fail")
			if !errors.Is(vc.Err(), errChunkOrder) {
				t.Fatalf("the vconn failed with %v, want errChunkOrder", vc.Err())
			}
			var got []string
			for {
				m, err := vc.Recv(ctx)
				if err != nil {
					break
				}
				got = append(got, string(m.Data))
				m.Release()
			}
			if want := []string{"first", "secnd"}; fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("delivered %q, want %q", got, want)
			}
		})
	}
}
