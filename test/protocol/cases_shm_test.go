package protocol

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// shmPair is a pair whose dialling side (A) is on shared memory.
func shmPair(t *testing.T, e *env) (*pair, *segment) {
	t.Helper()
	p := newPair(t, e)
	return p, openShm(t, p.A, p.ha)
}

// §5 Shared memory.
var shmCases = []conformanceCase{
	{"R5.1", "Shm before any Grant: OK with a Layout in its rules and memfd, TX doorbell, RX doorbell", rc, false, func(t *testing.T, e *env) {
		p, _ := shmPair(t, e) // openShm checks the OK, the Layout and the descriptors' kinds
		// Not once more, nor on a handle the session does not have (R8.8).
		p.A.fails(frame.Frame{Op: frame.OpShm, Handle: p.ha + 100}, frame.CodeNoHandle)
	}},
	{"R5.2", "on shared memory, Grants are ignored and no Data comes on the socket", rc, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		p.A.send(frame.Frame{Op: frame.OpGrant, Handle: p.ha, Arg: 32})
		p.B.sendMsg(p.hb, []byte("in the ring"))
		if _, b := seg.rx.take(t); string(b) != "in the ring" {
			t.Fatalf("ring RX: %q", b)
		}
		p.A.expectQuiet(300 * time.Millisecond)
	}},
	{"R5.3", "the memfd is sealed against shrinking, growing and sealing; the doorbells are stream sockets", rc, false, func(t *testing.T, e *env) {
		_, seg := shmPair(t, e)
		seals, err := unix.FcntlInt(seg.memfd.Fd(), unix.F_GET_SEALS, 0)
		want := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		if err != nil || seals&want != want {
			t.Fatalf("seals %#x, %v; want %#x", seals, err, want)
		}
	}},
	{"R5.4", "both rings start empty: tail and head 0, the flags 0 but the agent's own sleeping on ring TX", rc, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		for name, r := range map[string]*ring{"TX": seg.tx, "RX": seg.rx} {
			v := [4]uint32{atomic.LoadUint32(r.tail()), atomic.LoadUint32(r.head()), atomic.LoadUint32(r.sleeping()), atomic.LoadUint32(r.waiting())}
			if name == "TX" && v[2] <= 1 {
				v[2] = 0 // the agent may sleep on it already
			}
			if v != [4]uint32{} {
				t.Fatalf("ring %s: tail, head, consumer sleeping, producer waiting = %v", name, v)
			}
		}
		// The first message from index 0 of each ring.
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		seg.tx.publish(t, []byte("first"), 0, 0)
		if m := p.B.data(p.hb); string(m.Payload) != "first" {
			t.Fatalf("got %q", m.Payload)
		}
		p.B.sendMsg(p.hb, []byte("first"))
		if _, b := seg.rx.take(t); string(b) != "first" || atomic.LoadUint32(seg.rx.tail()) != 1 {
			t.Fatalf("ring RX: %q, tail %d", b, atomic.LoadUint32(seg.rx.tail()))
		}
	}},
	{"R5.5", "the agent sends ring TX's messages in order, with their immediates, and releases them", rc, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 8})
		seg.tx.publish(t, []byte("one"), 0, 0)
		seg.tx.publish(t, []byte("two"), 0xfeed, descImm)
		seg.tx.publish(t, bytes.Repeat([]byte{3}, 1000), 0, 0)
		if m := p.B.data(p.hb); string(m.Payload) != "one" || m.Flags != 0 {
			t.Fatalf("first: %v %q", m, m.Payload)
		}
		if m := p.B.data(p.hb); string(m.Payload) != "two" || m.Flags != frame.FlagImm || m.Arg != 0xfeed {
			t.Fatalf("second: %v %q", m, m.Payload)
		}
		if m := p.B.data(p.hb); len(m.Payload) != 1000 {
			t.Fatalf("third: %d bytes", len(m.Payload))
		}
		poll.Until(t, 10*time.Second, "ring TX released", func() bool { return atomic.LoadUint32(seg.tx.head()) == 3 })
	}},
	{"R5.6", "the agent produces ring RX: one descriptor a message, and the doorbell when the client sleeps", rc, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		p.B.sendMsg(p.hb, []byte("a"))
		p.B.call(frame.Frame{Op: frame.OpSend, Handle: p.hb, Flags: frame.FlagImm, Arg: 5, Payload: []byte("b")})
		if d, b := seg.rx.take(t); string(b) != "a" || d.flags != 0 {
			t.Fatalf("first: %+v %q", d, b)
		}
		if d, b := seg.rx.take(t); string(b) != "b" || d.flags != descImm || d.imm != 5 {
			t.Fatalf("second: %+v %q", d, b)
		}
		// Arm, then a message: the agent clears the flag and rings.
		atomic.StoreUint32(seg.rx.sleeping(), 1)
		p.B.sendMsg(p.hb, []byte("c"))
		poll.Until(t, 10*time.Second, "consumer sleeping cleared", func() bool { return atomic.LoadUint32(seg.rx.sleeping()) == 0 })
		if !readable(seg.rx.bell, 10*time.Second) {
			t.Fatal("the RX doorbell was not rung")
		}
		if _, b := seg.rx.take(t); string(b) != "c" {
			t.Fatalf("third: %q", b)
		}
	}},
	{"R5.7", "a descriptor with FlagEOF in ring TX aborts the vconn: BadRequest as ring RX's last descriptor", rc, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		seg.tx.publish(t, nil, 0, descEOF)
		d, b := seg.rx.take(t)
		if d.flags != descError || d.imm != uint32(frame.CodeBadRequest) || len(b) == 0 {
			t.Fatalf("ring RX: %+v %q, want FlagError with CodeBadRequest", d, b)
		}
		p.A.alive()
	}},
	{"R5.8", "the peer's close is ring RX's last descriptor, FlagEOF", rc, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		p.B.sendMsg(p.hb, []byte("bye"))
		p.B.call(frame.Frame{Op: frame.OpClose, Handle: p.hb})
		if _, b := seg.rx.take(t); string(b) != "bye" {
			t.Fatalf("got %q", b)
		}
		if d, b := seg.rx.take(t); d.flags != descEOF || len(b) != 0 {
			t.Fatalf("got %+v, want FlagEOF", d)
		}
	}},
	{"R5.9", "a message too large for the vconn's transport: an Error push TooLarge on the socket; the vconn still receives", ud, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		seg.tx.publish(t, make([]byte, 8000), 0, 0)
		m := p.A.recv()
		if m.Op != frame.OpError || m.Req != 0 || m.Handle != p.ha || frame.Code(m.Arg) != frame.CodeTooLarge {
			t.Fatalf("got %v, want an Error push CodeTooLarge", m)
		}
		p.B.sendMsg(p.hb, []byte("still here"))
		if _, b := seg.rx.take(t); string(b) != "still here" {
			t.Fatalf("got %q", b)
		}
		// Ring TX is read no more: the refused message is not released,
		// and what follows it is not sent.
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 4})
		seg.tx.publish(t, []byte("after"), 0, 0)
		p.B.expectQuiet(500 * time.Millisecond)
		if h := atomic.LoadUint32(seg.tx.head()); h != 0 {
			t.Fatalf("ring TX's head %d, want 0", h)
		}
	}},
	{"R5.10", "Close of a shared-memory vconn: OK, the peer's EOF, and the agent closes the doorbells", rc, false, func(t *testing.T, e *env) {
		p, seg := shmPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 4})
		seg.tx.publish(t, []byte("sent"), 0, 0)
		poll.Until(t, 10*time.Second, "ring TX released", func() bool { return atomic.LoadUint32(seg.tx.head()) == 1 })
		p.A.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		p.B.data(p.hb)
		if m := p.B.recv(); m.Op != frame.OpEOF {
			t.Fatalf("got %v, want EOF", m)
		}
		poll.Until(t, 10*time.Second, "the doorbells closed", func() bool { return atEOF(seg.tx.bell) && atEOF(seg.rx.bell) })
	}},
}

// §7 A session, step by step.
var walkthroughCases = []conformanceCase{
	{"R7.1", "the walkthrough: one socket, both ends", rc, false, func(t *testing.T, e *env) {
		s := dial(t, "A", alloc(t, e.a, 4))
		s.send(frame.Frame{Op: frame.OpHello, Req: 1, Arg: 1})
		s.expectOK(1, 0)
		p := port()
		s.send(frame.Frame{Op: frame.OpListen, Req: 2, Arg: p})
		l := s.expectOK(2, 0+1).Handle
		s.send(frame.Frame{Op: frame.OpDial, Req: 3, Payload: []byte(fmt.Sprintf("node-a:%d", p))})
		var v1, v2 uint32
		for v1 == 0 || v2 == 0 {
			switch m := s.recv(); {
			case m.Op == frame.OpAccept && m.Handle == l:
				v2 = m.Arg
			case m.Op == frame.OpOK && m.Req == 3:
				v1 = m.Handle
			default:
				t.Fatalf("step 3: %v", m)
			}
		}
		s.send(frame.Frame{Op: frame.OpGrant, Handle: v1, Arg: 32})
		s.send(frame.Frame{Op: frame.OpGrant, Handle: v2, Arg: 32})
		s.send(frame.Frame{Op: frame.OpSend, Req: 4, Handle: v1, Payload: []byte("echo")})
		got := map[frame.Op]msg{}
		for range 2 {
			m := s.recv()
			got[m.Op] = m
		}
		if got[frame.OpOK].Req != 4 || got[frame.OpData].Handle != v2 || string(got[frame.OpData].Payload) != "echo" {
			t.Fatalf("step 5: %v", got)
		}
		s.send(frame.Frame{Op: frame.OpSend, Req: 5, Handle: v2, Payload: []byte("echo")})
		got = map[frame.Op]msg{}
		for range 2 {
			m := s.recv()
			got[m.Op] = m
		}
		if got[frame.OpOK].Req != 5 || got[frame.OpData].Handle != v1 || string(got[frame.OpData].Payload) != "echo" {
			t.Fatalf("step 6: %v", got)
		}
		s.send(frame.Frame{Op: frame.OpClose, Req: 6, Handle: v1})
		got = map[frame.Op]msg{}
		for range 2 {
			m := s.recv()
			got[m.Op] = m
		}
		if got[frame.OpOK].Req != 6 || got[frame.OpEOF].Handle != v2 {
			t.Fatalf("step 7: %v", got)
		}
		s.call(frame.Frame{Op: frame.OpClose, Handle: v2})
		s.call(frame.Frame{Op: frame.OpClose, Handle: l})
	}},
}
