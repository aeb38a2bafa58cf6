package protocol

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// fileConn makes a net.Conn of a bridged vconn's socket; the Conn holds
// the only descriptor.
func fileConn(t *testing.T, f *os.File) *net.UnixConn {
	t.Helper()
	c, err := net.FileConn(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c.(*net.UnixConn)
}

func readN(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes of a bridged vconn: %v", n, err)
	}
	return b
}

// §3 Requests and replies.
var requestCases = slices.Concat(requestCases1, requestCases2, requestCases3)

var requestCases1 = []conformanceCase{
	{"R3.1", "every request but Grant is answered exactly once, with its req", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		s := p.A
		fs := []frame.Frame{
			{Op: frame.OpSend, Handle: p.ha, Payload: []byte("x")},
			{Op: frame.OpExport, Handle: p.ha, Arg: 1, Arg2: 64},
			{Op: frame.OpLocalWrite, Handle: p.ha, Arg: 1, Payload: []byte("y")},
			{Op: frame.OpLocalRead, Handle: p.ha, Arg: 1, Payload: length(1)},
			{Op: frame.OpRead, Handle: p.ha, Arg: 1, Payload: length(1)},
			{Op: frame.OpWrite, Handle: p.ha, Arg: 1, Payload: []byte("z")},
			{Op: frame.OpUnexport, Handle: p.ha, Arg: 1},
			{Op: frame.OpListen, Arg: port()},
			{Op: frame.OpDial, Payload: []byte(fmt.Sprintf("node-b:%d", port()))},
			{Op: frame.OpHello, Arg: frame.Version},
			{Op: frame.OpClose, Handle: 999},
			{Op: frame.OpShm, Handle: 999},
			{Op: frame.OpGrant, Handle: p.ha, Arg: 1},
		}
		want := map[uint32]bool{}
		for i := range fs {
			if fs[i].Op != frame.OpGrant {
				fs[i].Req = s.next()
				want[fs[i].Req] = true
			}
			s.send(fs[i])
		}
		for len(want) > 0 {
			m := s.recv()
			if !want[m.Req] || (m.Op != frame.OpOK && m.Op != frame.OpError) {
				t.Fatalf("got %v: no request of that req awaits an answer", m)
			}
			delete(want, m.Req)
		}
		s.expectQuiet(300 * time.Millisecond)
	}},
	{"R3.2", "the operations of one vconn are run and answered in the order sent", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		s := p.A
		var reqs []uint32
		for i := range 16 {
			f := frame.Frame{Op: frame.OpSend, Handle: p.ha, Payload: []byte{byte(i)}}
			switch i % 4 {
			case 1:
				f = frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 128}
			case 2:
				f = frame.Frame{Op: frame.OpLocalWrite, Handle: p.ha, Arg: 1, Arg2: uint64(i), Payload: []byte{byte(i)}}
			case 3:
				f = frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: 1, Arg2: uint64(i - 1), Payload: length(1)}
			}
			f.Req = s.next()
			reqs = append(reqs, f.Req)
			s.send(f)
		}
		for i, req := range reqs {
			m := s.recv()
			if m.Req != req || m.Op != frame.OpOK {
				t.Fatalf("got %v, want the OK of req %d next", m, req)
			}
			if i%4 == 3 && !bytes.Equal(m.Payload, []byte{byte(i - 1)}) {
				t.Fatalf("LocalRead %d read %v: the LocalWrite before it had not run", req, m.Payload)
			}
		}
	}},
	{"R3.3", "a Grant is not answered, whatever its req", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Req: 4242, Handle: p.hb, Arg: 1})
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		p.B.expectQuiet(300 * time.Millisecond)
		// Both granted a message.
		p.A.sendMsg(p.ha, []byte("1"))
		p.A.sendMsg(p.ha, []byte("2"))
		p.B.data(p.hb)
		p.B.data(p.hb)
	}},
	{"R3.4", "replies of per-vconn operations carry the vconn's handle; those of Hello, Listen, Dial their own", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a := p.A
		a.call(frame.Frame{Op: frame.OpSend, Handle: p.ha, Payload: []byte("x")})
		r := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}).Arg
		a.call(frame.Frame{Op: frame.OpLocalWrite, Handle: p.ha, Arg: r, Payload: []byte("x")})
		a.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Payload: length(1)})
		a.fails(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r + 1, Payload: length(1)}, frame.CodeRegion)
		a.call(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: r})
		a.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		// Hello's reply: handle 0; Listen's and Dial's: the handle made.
		req := a.next()
		a.send(frame.Frame{Op: frame.OpHello, Req: req, Arg: frame.Version})
		a.expectOK(req, 0)
		req = a.next()
		a.send(frame.Frame{Op: frame.OpListen, Req: req, Arg: port()})
		if m := a.recv(); m.Op != frame.OpOK || m.Req != req || m.Handle <= p.ha {
			t.Fatalf("Listen: %v, want a new handle", m)
		}
		if m := a.dialVConn(p.addr); m.Handle == 0 {
			t.Fatalf("Dial: %v", m)
		}
		a.fails(frame.Frame{Op: frame.OpDial, Payload: []byte("nowhere:1")}, frame.CodeUnknownHost)
	}},
}

var requestCases2 = []conformanceCase{
	{"R3.5", "fields marked 0, and flags of other ops, are not read", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a, b := p.A, p.B
		b.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 8, Arg2: 77, Payload: []byte("ignored")})
		// Send without FlagImm: arg is not an immediate; FlagBridge on a Send does nothing.
		a.call(frame.Frame{Op: frame.OpSend, Handle: p.ha, Arg: 0x1234, Arg2: 9, Payload: []byte("one")})
		a.call(frame.Frame{Op: frame.OpSend, Handle: p.ha, Flags: frame.FlagBridge, Payload: []byte("two")})
		for _, want := range []string{"one", "two"} {
			if m := b.data(p.hb); m.Flags != 0 || m.Arg != 0 || string(m.Payload) != want {
				t.Fatalf("got %v %q, want plain Data %q", m, m.Payload, want)
			}
		}
		// FlagImm on an Export, arg2 and a payload on a Listen, arg and arg2 on a Close.
		a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Flags: frame.FlagImm, Arg: 3, Arg2: 64})
		l := a.call(frame.Frame{Op: frame.OpListen, Arg: port(), Arg2: 5, Payload: []byte("x")}).Handle
		a.call(frame.Frame{Op: frame.OpClose, Handle: l, Arg: 7, Arg2: 9})
		a.call(frame.Frame{Op: frame.OpClose, Handle: p.ha, Arg: 7, Arg2: 9, Payload: []byte("x")})
	}},
	{"R3.6", "a later Hello is answered again, the same, changing nothing", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a := p.A
		req := a.next()
		a.send(frame.Frame{Op: frame.OpHello, Req: req, Arg: frame.Version})
		again := a.expectOK(req, 0)
		req = a.next()
		a.send(frame.Frame{Op: frame.OpHello, Req: req, Arg: frame.Version})
		if m := a.expectOK(req, 0); !bytes.Equal(m.Payload, again.Payload) || m.Arg != frame.Version {
			t.Fatalf("a third Hello: %v %x, the second %x", m, m.Payload, again.Payload)
		}
		a.sendMsg(p.ha, []byte("the vconn is still there"))
	}},
	{"R3.7", "Hello's OK: the features offered; the HelloInfo: the allocation's quota, the send window (16), the max message, the node's name", rc, false, func(t *testing.T, e *env) {
		s := dial(t, "A", alloc(t, e.a, 7))
		s.send(frame.Frame{Op: frame.OpHello, Req: 9, Arg: frame.Version})
		m := s.expectOK(9, 0)
		if m.Arg != frame.Version || len(m.Payload) < 12 || len(m.Payload) > 265 {
			t.Fatalf("Hello's OK: arg %d, HelloInfo of %d bytes", m.Arg, len(m.Payload))
		}
		if f, want := frame.Features(m.Arg2), frame.FeatureMemfd|frame.FeatureStage; f != want {
			t.Fatalf("Hello's OK offers features %#x, want %#x (FeatureMemfd, FeatureStage)", f, want)
		}
		h, err := frame.DecodeHello(m.Payload)
		if err != nil || h.Quota != 7 || h.SendWindow != 16 || h.MaxMessage != frame.MaxPayload || h.Node != "node-a" {
			t.Fatalf("HelloInfo %+v, %v; want quota 7, window 16, max %d, node-a", h, err, frame.MaxPayload)
		}
	}},
	{"R3.8", "the quota counts vconns dialled and accepted across the allocation's sessions; a Close frees one", rc, false, func(t *testing.T, e *env) {
		sock := alloc(t, e.a, 2)
		s1, s2 := open(t, "S1", sock), open(t, "S2", sock)
		port := port()
		l := s1.listen(port)
		addr := fmt.Sprintf("node-a:%d", port)
		v := s2.dialVConn(addr).Handle // dialled by S2, accepted by S1: two
		s1.accept(l)
		s2.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(fmt.Sprintf("node-b:%d", port))}, frame.CodeQuota)
		s2.call(frame.Frame{Op: frame.OpClose, Handle: v})
		// One slot free: a dial to node-b (nothing listens) is refused, not over quota.
		s2.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(fmt.Sprintf("node-b:%d", port))}, frame.CodeRefused)
	}},
	{"R3.9", "Listen binds in the allocation's port space: \"node:port\" for host services, \"podIP:port\" for a pod", rc, false, func(t *testing.T, e *env) {
		p := port()
		s := open(t, "host", alloc(t, e.b, 2))
		if m := s.call(frame.Frame{Op: frame.OpListen, Arg: p}); string(m.Payload) != fmt.Sprintf("node-b:%d", p) {
			t.Fatalf("a host service's Listen: bound %q", m.Payload)
		}
		pod := open(t, "pod", podAlloc(t, e.b, "10.244.9.1", 2))
		// The pod's own port space: the same port again.
		if m := pod.call(frame.Frame{Op: frame.OpListen, Arg: p}); string(m.Payload) != fmt.Sprintf("10.244.9.1:%d", p) {
			t.Fatalf("a pod's Listen: bound %q", m.Payload)
		}
	}},
	{"R3.10", "Dial takes a node's name, a node's IP or a pod IP; the OK's payload is the address as dialled", rc, false, func(t *testing.T, e *env) {
		p := port()
		host := open(t, "host", alloc(t, e.b, 8))
		host.listen(p)
		pod := open(t, "pod", podAlloc(t, e.b, "10.244.9.2", 8))
		pod.listen(p)
		a := open(t, "A", alloc(t, e.a, 8))
		for _, addr := range []string{fmt.Sprintf("node-b:%d", p), fmt.Sprintf("127.0.0.3:%d", p), fmt.Sprintf("10.244.9.2:%d", p)} {
			if m := a.dialVConn(addr); string(m.Payload) != addr {
				t.Fatalf("dial %s: the OK says %q", addr, m.Payload)
			}
		}
	}},
	{"R3.11", "Accept: handle = the listener, arg = the new vconn, arg2 = VConnInfo, payload = the dialler's \"node:0\" or \"podIP:0\"", rc, false, func(t *testing.T, e *env) {
		p := port()
		b := open(t, "B", alloc(t, e.b, 8))
		l := b.listen(p)
		addr := fmt.Sprintf("node-b:%d", p)
		open(t, "host", alloc(t, e.a, 2)).dialVConn(addr)
		m := b.accept(l)
		if string(m.Payload) != "node-a:0" || m.Arg2 != 0x100010000 || m.Arg <= l {
			t.Fatalf("Accept of a host service's dial: %v %q", m, m.Payload)
		}
		open(t, "pod", podAlloc(t, e.a, "10.244.9.3", 2)).dialVConn(addr)
		if m := b.accept(l); string(m.Payload) != "10.244.9.3:0" {
			t.Fatalf("Accept of a pod's dial: %v %q", m, m.Payload)
		}
	}},
	{"R3.12", "bridged Dial and Accept: no handle, VConnInfo, a stream socket; a byte stream both ways; shutdown(SHUT_WR) is EOF", rc, false, func(t *testing.T, e *env) {
		b := open(t, "B", alloc(t, e.b, 4))
		lm := b.call(frame.Frame{Op: frame.OpListen, Flags: frame.FlagBridge, Arg: port()})
		a := open(t, "A", alloc(t, e.a, 4))
		req := a.next()
		a.send(frame.Frame{Op: frame.OpDial, Req: req, Flags: frame.FlagBridge, Payload: lm.Payload})
		d := a.recvFDs(1)
		if d.Op != frame.OpOK || d.Req != req || d.Handle != 0 || d.Arg2 != 0x100010000 || !bytes.Equal(d.Payload, lm.Payload) {
			t.Fatalf("bridged dial's OK: %v %q", d, d.Payload)
		}
		acc := b.recvFDs(1)
		if acc.Op != frame.OpAccept || acc.Handle != lm.Handle || acc.Arg != 0 || acc.Arg2 != 0x100010000 || string(acc.Payload) != "node-a:0" {
			t.Fatalf("bridged Accept: %v %q", acc, acc.Payload)
		}
		client, server := fileConn(t, d.fds[0]), fileConn(t, acc.fds[0])
		big := bytes.Repeat([]byte("0123456789abcdef"), 20000) // several messages
		go func() { _, _ = client.Write(big) }()
		if got := readN(t, server, len(big)); !bytes.Equal(got, big) {
			t.Fatal("the bytes differ")
		}
		if err := client.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = server.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := server.Read(make([]byte, 1)); n != 0 || err != io.EOF {
			t.Fatalf("after the dialler's shutdown(SHUT_WR): %d, %v; want EOF", n, err)
		}
		if _, err := server.Write([]byte("answer")); err != nil {
			t.Fatal(err)
		}
		if got := readN(t, client, 6); string(got) != "answer" {
			t.Fatalf("the answer after a half-close: %q", got)
		}
	}},
	{"R3.13", "a bridged vconn outlives its session and holds its quota until both directions end", rc, false, func(t *testing.T, e *env) {
		b := open(t, "B", alloc(t, e.b, 4))
		lm := b.call(frame.Frame{Op: frame.OpListen, Flags: frame.FlagBridge, Arg: port()})
		sockA := alloc(t, e.a, 4)
		a := open(t, "A", sockA)
		req := a.next()
		a.send(frame.Frame{Op: frame.OpDial, Req: req, Flags: frame.FlagBridge, Payload: lm.Payload})
		client := fileConn(t, a.recvFDs(1).fds[0])
		server := fileConn(t, b.recvFDs(1).fds[0])
		_ = a.c.Close()
		_ = b.c.Close()
		if _, err := client.Write([]byte("after")); err != nil {
			t.Fatal(err)
		}
		if got := readN(t, server, 5); string(got) != "after" {
			t.Fatalf("after the sessions ended: %q", got)
		}
		if n := inUse(e.a, sockA); n != 1 {
			t.Fatalf("the dialler's allocation holds %d vconns, want 1", n)
		}
		_ = client.Close()
		_ = server.Close()
		poll.Until(t, 10*time.Second, "the quota freed", func() bool { return inUse(e.a, sockA) == 0 })
	}},
	{"R3.14", "VConnInfo in arg2: rc carries 65,536 bytes", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a := open(t, "A", alloc(t, e.a, 2))
		if m := a.dialVConn(p.addr); m.Arg2 != 1<<32|65536 {
			t.Fatalf("Dial's OK: arg2 %#x, want rc, 65536", m.Arg2)
		}
		if m := p.B.accept(p.l); m.Arg2 != 1<<32|65536 {
			t.Fatalf("Accept: arg2 %#x, want rc, 65536", m.Arg2)
		}
	}},
	{"R3.14", "VConnInfo in arg2: ud carries one MTU less the engine's header", ud, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a := open(t, "A", alloc(t, e.a, 2))
		m := a.dialVConn(p.addr)
		acc := p.B.accept(p.l)
		for _, arg2 := range []uint64{m.Arg2, acc.Arg2} {
			if tr, max := arg2>>32, uint32(arg2); tr != 3 || max == 0 || max >= 4096 || arg2>>40 != 0 {
				t.Fatalf("arg2 %#x: transport %d, max message %d; want ud (3), under an MTU, bits 40..63 zero", arg2, tr, max)
			}
		}
	}},
	{"R3.15", "handles count from 1, one counter for vconns and listeners, never 0, never reused", rc, false, func(t *testing.T, e *env) {
		s := open(t, "A", alloc(t, e.a, 8))
		p := port()
		l := s.listen(p)
		req := s.next()
		s.send(frame.Frame{Op: frame.OpDial, Req: req, Payload: []byte(fmt.Sprintf("node-a:%d", p))})
		var dialled, accepted uint32
		for dialled == 0 || accepted == 0 {
			switch m := s.recv(); m.Op {
			case frame.OpOK:
				dialled = m.Handle
			case frame.OpAccept:
				accepted = m.Arg
			default:
				t.Fatalf("got %v", m)
			}
		}
		got := []uint32{l, dialled, accepted}
		if l != 1 || !(dialled == 2 && accepted == 3 || dialled == 3 && accepted == 2) {
			t.Fatalf("listener, dialled, accepted: %v; want 1 and then 2, 3", got)
		}
		s.call(frame.Frame{Op: frame.OpClose, Handle: dialled})
		s.call(frame.Frame{Op: frame.OpClose, Handle: accepted})
		s.call(frame.Frame{Op: frame.OpClose, Handle: l})
		if h := s.listen(p); h != 4 {
			t.Fatalf("the next handle after three closed: %d, want 4", h)
		}
	}},
	{"R3.16", "Send: up to the vconn's max message; FlagImm's immediate arrives with it", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 8})
		big := bytes.Repeat([]byte{7}, frame.MaxPayload)
		p.A.sendMsg(p.ha, big)
		p.A.call(frame.Frame{Op: frame.OpSend, Handle: p.ha, Flags: frame.FlagImm, Arg: 0xdeadbeef, Payload: []byte("i")})
		if m := p.B.data(p.hb); !bytes.Equal(m.Payload, big) || m.Flags != 0 {
			t.Fatalf("a message of %d bytes: %v", frame.MaxPayload, m)
		}
		if m := p.B.data(p.hb); m.Flags != frame.FlagImm || m.Arg != 0xdeadbeef || string(m.Payload) != "i" {
			t.Fatalf("a message with an immediate: %v", m)
		}
	}},
	{"R3.17", "an empty message is a message", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 2})
		p.A.sendMsg(p.ha, nil)
		p.A.sendMsg(p.ha, []byte("after"))
		if m := p.B.data(p.hb); len(m.Payload) != 0 {
			t.Fatalf("got %d bytes, want an empty message", len(m.Payload))
		}
		if m := p.B.data(p.hb); string(m.Payload) != "after" {
			t.Fatalf("got %q", m.Payload)
		}
	}},
	{"R3.18", "exactly the send window (16) of a vconn's operations may be unanswered", rc, false, func(t *testing.T, e *env) {
		w := stallSends(t, e)
		if w.pending != 16 {
			t.Fatalf("%d operations unanswered once the engine stopped taking sends, want 16", w.pending)
		}
		if w.refused == 0 {
			t.Fatal("no operation past the window was refused")
		}
	}},
	{"R3.19", "Data only while the window granted is positive; Grants add up; Grant 0 does nothing", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for i := range 3 {
			p.A.sendMsg(p.ha, []byte{byte(i)})
		}
		p.B.expectQuiet(300 * time.Millisecond)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb})
		p.B.expectQuiet(300 * time.Millisecond)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		p.B.data(p.hb)
		p.B.data(p.hb)
		p.B.expectQuiet(300 * time.Millisecond)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		if m := p.B.data(p.hb); !bytes.Equal(m.Payload, []byte{2}) {
			t.Fatalf("the third message: %v", m.Payload)
		}
	}},
	{"R3.20", "EOF comes after every message sent before the Close, and nothing after it", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 32})
		for i := range 5 {
			p.A.sendMsg(p.ha, []byte{byte(i)})
		}
		p.A.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		for i := range 5 {
			if m := p.B.data(p.hb); !bytes.Equal(m.Payload, []byte{byte(i)}) {
				t.Fatalf("message %d: %v", i, m.Payload)
			}
		}
		if m := p.B.recv(); m.Op != frame.OpEOF || m.Handle != p.hb || m.Req != 0 {
			t.Fatalf("got %v, want EOF", m)
		}
		p.B.expectQuiet(300 * time.Millisecond)
	}},
	{"R3.21", "after an Error push no Data comes, and later Sends fail with its code", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		resetByPeer(t, p.B, p.hb)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 8})
		if m := p.B.recv(); m.Op != frame.OpError || m.Req != 0 || m.Handle != p.hb || frame.Code(m.Arg) != frame.CodeReset {
			t.Fatalf("got %v, want an Error push CodeReset", m)
		}
		p.B.fails(frame.Frame{Op: frame.OpSend, Handle: p.hb, Payload: []byte("x")}, frame.CodeReset)
		p.B.expectQuiet(300 * time.Millisecond)
	}},
	{"R3.22", "no push before a vconn's OK or Accept; its end waits for window", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		// B closes at once: A, which has not granted, hears nothing.
		p.B.call(frame.Frame{Op: frame.OpClose, Handle: p.hb})
		p.A.expectQuiet(500 * time.Millisecond)
		p.A.send(frame.Frame{Op: frame.OpGrant, Handle: p.ha, Arg: 1})
		if m := p.A.recv(); m.Op != frame.OpEOF || m.Handle != p.ha {
			t.Fatalf("got %v, want EOF once granted", m)
		}
		// A dial whose peer closes before the dialler reads: the OK first.
		b := open(t, "B2", alloc(t, e.b, 8))
		port := port()
		l := b.listen(port)
		a := open(t, "A2", alloc(t, e.a, 8))
		req := a.next()
		a.send(frame.Frame{Op: frame.OpDial, Req: req, Payload: []byte(fmt.Sprintf("node-b:%d", port))})
		acc := b.accept(l)
		b.call(frame.Frame{Op: frame.OpClose, Handle: acc.Arg})
		// And the other way: the Accept comes first, its EOF once granted.
		a3 := open(t, "A3", alloc(t, e.a, 8))
		v := a3.dialVConn(fmt.Sprintf("node-b:%d", port)).Handle
		a3.call(frame.Frame{Op: frame.OpClose, Handle: v})
		acc3 := b.accept(l)
		b.expectQuiet(300 * time.Millisecond)
		b.send(frame.Frame{Op: frame.OpGrant, Handle: acc3.Arg, Arg: 1})
		if m := b.recv(); m.Op != frame.OpEOF || m.Handle != acc3.Arg {
			t.Fatalf("got %v, want EOF after the Accept, once granted", m)
		}
		time.Sleep(200 * time.Millisecond)
		ok := a.recv()
		if ok.Op != frame.OpOK || ok.Req != req {
			t.Fatalf("got %v, want the Dial's OK first", ok)
		}
		a.expectQuiet(300 * time.Millisecond)
		a.send(frame.Frame{Op: frame.OpGrant, Handle: ok.Handle, Arg: 1})
		if m := a.recv(); m.Op != frame.OpEOF || m.Handle != ok.Handle {
			t.Fatalf("got %v, want EOF after the OK, once granted", m)
		}
	}},
}
