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

// TestChunkNumbers: a peer's data chunk on RC is taken only at its
// number: an RC vconn's in the header's arg, an Auto vconn's in bytes 2..3
// (format.Header.AutoChunkNo). One marked resent that came already is
// dropped (the resend after a QP replacement); the same chunk unmarked, or
// one past a missing chunk, is no engine's doing: the vconn fails, and
// nothing is delivered twice or past a hole. From an engine that numbers
// nothing (an older one: its QPRequest says so) chunks are taken as they
// come, every one delivered.
func TestChunkNumbers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	whole := func(seq uint32, flags uint8) format.Header {
		d := format.DataHeader(5, seq, 0, false)
		d.Flags |= format.FlagFirst | format.FlagLast | flags
		return d
	}
	type at struct{ seq, no uint32 }
	for _, tr := range []struct {
		name        string
		o           VConnOptions
		ip, olderIP string
		// chunk is the header of message seq as chunk no.
		chunk func(seq, no uint32, flags uint8) format.Header
		// older makes the peer an engine that numbers nothing.
		older            func(p *Peer)
		repeated, beyond at
	}{
		{
			name: "rc", ip: "10.9.0.70", olderIP: "10.9.0.71",
			chunk: func(seq, no uint32, flags uint8) format.Header {
				d := whole(seq, flags)
				d.Arg = no
				return d
			},
			older:    func(p *Peer) { p.numbers.Store(false) },
			repeated: at{0, 0}, beyond: at{3, 3},
		},
		{
			name: "auto", o: VConnOptions{Transport: transport.Auto}, ip: "10.9.0.72", olderIP: "10.9.0.73",
			chunk: func(seq, no uint32, flags uint8) format.Header {
				d := whole(seq, flags)
				d.Chunk = uint16(no)
				return d
			},
			older:    func(p *Peer) { p.numbersAuto.Store(false) },
			repeated: at{1, 1}, beyond: at{2, 3},
		},
	} {
		t.Run(tr.name+"/older engine", func(t *testing.T) {
			a, h, vc, _, in1 := twoQPPeer(ctx, t, tr.olderIP, tr.o)
			tr.older(vc.peer)
			for i, s := range []string{"first", "secnd", "third"} {
				h.send(in1, a, vc.ID(), tr.chunk(uint32(i), 0, 0), []byte(s))
				m, err := vc.Recv(ctx)
				if err != nil || string(m.Data) != s {
					t.Fatalf("received %q, %v; want %q", m.Data, err, s)
				}
				m.Release()
			}
		})
		for _, tc := range []struct {
			name string
			bad  at
		}{
			{"repeated unmarked", tr.repeated},
			{"past a hole", tr.beyond},
		} {
			t.Run(tr.name+"/"+tc.name, func(t *testing.T) {
				a, h, vc, _, in1 := twoQPPeer(ctx, t, tr.ip, tr.o)
				h.send(in1, a, vc.ID(), tr.chunk(0, 0, 0), []byte("first"))
				before := a.Stats().ResentDropped
				h.send(in1, a, vc.ID(), tr.chunk(0, 0, format.FlagResent), []byte("again"))
				waitFor(t, func() bool { return a.Stats().ResentDropped == before+1 }, "the resent chunk dropped")
				h.send(in1, a, vc.ID(), tr.chunk(1, 1, format.FlagResent), []byte("secnd"))
				h.send(in1, a, vc.ID(), tr.chunk(tc.bad.seq, tc.bad.no, 0), []byte("wrong"))
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
}
