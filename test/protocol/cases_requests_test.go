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

	"golang.org/x/sys/unix"

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

// window is what stallSends saw: operations unanswered once the engine
// stopped taking a vconn's sends, and those refused past the window.
type window struct {
	p                *pair
	pending, refused int
	refusedReqs      []uint32
	answered         map[uint32]msg
}

// stallSends pipelines 16 KiB sends on a vconn whose peer never grants
// (the rc cluster's engines have 8 credits), in rounds of twice the
// window, until some stay unanswered; then one more round.
func stallSends(t *testing.T, e *env) *window {
	t.Helper()
	w := &window{p: newPair(t, e), answered: map[uint32]msg{}}
	a := w.p.A
	sent := 0
	drain := func() {
		for {
			m, err := a.read(time.Second)
			if err != nil {
				return
			}
			if _, dup := w.answered[m.Req]; dup || m.Req == 0 {
				t.Fatalf("got %v: answered twice, or a push", m)
			}
			w.answered[m.Req] = m
		}
	}
	round := func() {
		for range 32 {
			a.send(frame.Frame{Op: frame.OpSend, Req: a.next(), Handle: w.p.ha, Payload: make([]byte, 16<<10)})
			sent++
		}
		drain()
	}
	for i := 0; i < 100 && sent == len(w.answered); i++ {
		round()
	}
	if sent == len(w.answered) {
		t.Fatal("sends to a peer that grants nothing were all answered")
	}
	round()
	for req, m := range w.answered {
		if m.Op == frame.OpError {
			if frame.Code(m.Arg) != frame.CodeWindow || m.Handle != w.p.ha {
				t.Fatalf("send %d: %v, want CodeWindow", req, m)
			}
			w.refused++
			w.refusedReqs = append(w.refusedReqs, req)
		}
	}
	w.pending = sent - len(w.answered)
	return w
}

var requestCases3 = []conformanceCase{
	{"R3.23", "Close of a vconn: OK, the peer's EOF after what was taken, the quota slot freed", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 4})
		p.A.sendMsg(p.ha, []byte("last"))
		if n := inUse(e.a, p.A.sock); n != 1 {
			t.Fatalf("%d vconns in use, want 1", n)
		}
		p.A.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		if m := p.B.data(p.hb); string(m.Payload) != "last" {
			t.Fatalf("got %q", m.Payload)
		}
		if m := p.B.recv(); m.Op != frame.OpEOF {
			t.Fatalf("got %v, want EOF", m)
		}
		poll.Until(t, 10*time.Second, "the slot freed", func() bool { return inUse(e.a, p.A.sock) == 0 })
		p.A.fails(frame.Frame{Op: frame.OpSend, Handle: p.ha, Payload: []byte("x")}, frame.CodeNoHandle)
	}},
	{"R3.24", "Close of a listener: OK, and a Dial of its port is refused", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.call(frame.Frame{Op: frame.OpClose, Handle: p.l})
		p.A.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(p.addr)}, frame.CodeRefused)
		p.A.sendMsg(p.ha, []byte("the vconns accepted stay"))
	}},
	{"R3.25", "Export: 1 byte to maxMessageBytes, access 1, 2 or 3; region ids count from 1 on each vconn", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for i, x := range []struct {
			access uint32
			size   uint64
		}{{1, 1}, {2, 4096}, {3, 1 << 20}} {
			if m := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: x.access, Arg2: x.size}); m.Arg != uint32(i+1) {
				t.Fatalf("export %d: region %d, want %d", i, m.Arg, i+1)
			}
		}
		if m := p.B.call(frame.Frame{Op: frame.OpExport, Handle: p.hb, Arg: 3, Arg2: 64}); m.Arg != 1 {
			t.Fatalf("the peer's first region: %d, want 1", m.Arg)
		}
	}},
	{"R3.26", "an export reaches the peer before any message sent after its OK", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 32})
		for range limitRegions {
			r := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 1, Arg2: 64}).Arg
			p.A.sendMsg(p.ha, []byte{byte(r)})
			m := p.B.data(p.hb)
			p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: uint32(m.Payload[0]), Payload: length(8)})
		}
	}},
	{"R3.27", "LocalRead and LocalWrite copy this side's region; Read and Write the peer's, as its access allows", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a, b := p.A, p.B
		ro := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 1, Arg2: 64}).Arg
		wo := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 2, Arg2: 64}).Arg
		rw := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}).Arg
		a.call(frame.Frame{Op: frame.OpLocalWrite, Handle: p.ha, Arg: ro, Arg2: 8, Payload: []byte("ro")})
		a.sendMsg(p.ha, []byte("exported")) // the exports reached B before it
		b.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		b.data(p.hb)
		if m := b.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: ro, Arg2: 8, Payload: length(2)}); string(m.Payload) != "ro" {
			t.Fatalf("Read of a readable region: %q", m.Payload)
		}
		b.fails(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: ro, Payload: []byte("no")}, frame.CodeRegion)
		b.call(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: wo, Arg2: 4, Payload: []byte("wo")})
		b.fails(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: wo, Payload: length(2)}, frame.CodeRegion)
		if m := a.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: wo, Arg2: 4, Payload: length(2)}); string(m.Payload) != "wo" {
			t.Fatalf("LocalRead of what the peer wrote: %q", m.Payload)
		}
		b.call(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: rw, Payload: []byte("rw")})
		if m := b.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: rw, Payload: length(2)}); string(m.Payload) != "rw" {
			t.Fatalf("Read of a region both ways: %q", m.Payload)
		}
	}},
	{"R3.28", "Unexport: OK, and the id names nothing, on this side and then on the peer's", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		r := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}).Arg
		p.A.sendMsg(p.ha, nil)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		p.B.data(p.hb)
		p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Payload: length(1)})
		p.A.call(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: r})
		p.A.fails(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Payload: length(1)}, frame.CodeRegion)
		p.A.fails(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: r}, frame.CodeRegion)
		poll.Until(t, 10*time.Second, "the peer's Read refused", func() bool {
			req := p.B.next()
			p.B.send(frame.Frame{Op: frame.OpRead, Req: req, Handle: p.hb, Arg: r, Payload: length(1)})
			m := p.B.recv()
			if m.Op == frame.OpError && frame.Code(m.Arg) != frame.CodeRegion {
				t.Fatalf("a Read of a withdrawn region: %v, want CodeRegion", m)
			}
			return m.Op == frame.OpError
		})
	}},
	{"R3.29", "Export with FlagMemfd: the OK carries a sealed memfd of the region's size, and its bytes are the region's, both ways", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		const size = 10000
		req := p.A.next()
		p.A.send(frame.Frame{Op: frame.OpExport, Req: req, Handle: p.ha, Flags: frame.FlagMemfd, Arg: 3, Arg2: size})
		m := p.A.recvFDs(1)
		if m.Op != frame.OpOK || m.Req != req || m.Handle != p.ha || m.Arg != 1 {
			t.Fatalf("Export with FlagMemfd: %v, want OK naming region 1", m)
		}
		r, fd := m.Arg, int(m.fds[0].Fd())
		seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
		const want = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		if err != nil || seals&want != want {
			t.Fatalf("the memfd's seals: %#x, %v; want %#x", seals, err, want)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Size < size {
			t.Fatalf("the memfd: %d bytes, %v; want at least %d", st.Size, err, size)
		}
		// What a pod could do to the agent's mapping, refused.
		for _, n := range []int64{0, 4096, st.Size + 1} {
			if err := unix.Ftruncate(fd, n); err == nil {
				t.Fatalf("the pod resized the memfd to %d bytes", n)
			}
		}
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_WRITE); err == nil {
			t.Fatal("the pod sealed the memfd against writes")
		}
		mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Munmap(mem)
		copy(mem[9000:], "from the pod's mapping")
		if m := p.A.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Arg2: 9000, Payload: length(22)}); string(m.Payload) != "from the pod's mapping" {
			t.Fatalf("LocalRead of what the pod wrote in its mapping: %q", m.Payload)
		}
		p.A.call(frame.Frame{Op: frame.OpLocalWrite, Handle: p.ha, Arg: r, Arg2: 200, Payload: []byte("local")})
		if string(mem[200:205]) != "local" {
			t.Fatalf("the mapping after a LocalWrite: %q", mem[200:205])
		}
		p.A.sendMsg(p.ha, nil) // the export reached B before it
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		p.B.data(p.hb)
		if m := p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Arg2: 9000, Payload: length(22)}); string(m.Payload) != "from the pod's mapping" {
			t.Fatalf("the peer's Read of what the pod wrote in its mapping: %q", m.Payload)
		}
		p.B.call(frame.Frame{Op: frame.OpWrite, Handle: p.hb, Arg: r, Arg2: 100, Payload: []byte("from the peer")})
		if string(mem[100:113]) != "from the peer" {
			t.Fatalf("the mapping after the peer's Write: %q", mem[100:113])
		}
		// A hole the pod punches is zeros to both sides, not a fault.
		if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 0, 4096); err != nil {
			t.Fatal(err)
		}
		if m := p.B.call(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Arg2: 100, Payload: length(13)}); string(m.Payload) != string(make([]byte, 13)) {
			t.Fatalf("the peer's Read of a hole: %q", m.Payload)
		}
		p.A.call(frame.Frame{Op: frame.OpUnexport, Handle: p.ha, Arg: r})
		p.A.fails(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Payload: length(1)}, frame.CodeRegion)
		copy(mem, "still the pod's") // its own memory now
	}},
	{"R3.30", "Stage: a sealed memfd of the size asked, at most maxMessageBytes, not counted as a region", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		st := stage(t, p.A, p.ha, 1<<30)
		if st.size != 1<<20 {
			t.Fatalf("Stage of 1 GiB gave %d bytes, want maxMessageBytes (1 MiB)", st.size)
		}
		seals, err := unix.FcntlInt(uintptr(st.fd), unix.F_GET_SEALS, 0)
		const want = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
		if err != nil || seals&want != want {
			t.Fatalf("the memfd's seals: %#x, %v; want %#x", seals, err, want)
		}
		if err := unix.Ftruncate(st.fd, 0); err == nil {
			t.Fatal("the pod truncated the staging memfd")
		}
		q := stage(t, p.B, p.hb, 100)
		if q.size != 100 {
			t.Fatalf("Stage of 100 bytes gave %d", q.size)
		}
		// Not a region: limits.regions (4 here) still has room for 4.
		for range limitRegions {
			p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64})
		}
	}},
	{"R3.31", "Write and Read with FlagMemfd: the bytes of a span of staging memory, placed, and landed, any length that fits", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		const size = 300_000
		r := p.B.call(frame.Frame{Op: frame.OpExport, Handle: p.hb, Arg: 3, Arg2: size}).Arg
		p.B.sendMsg(p.hb, nil) // the export reached A before it
		p.A.send(frame.Frame{Op: frame.OpGrant, Handle: p.ha, Arg: 1})
		p.A.data(p.ha)
		st := stage(t, p.A, p.ha, 256<<10)
		mem := st.mmap(t)
		for i := range mem {
			mem[i] = byte(i * 13)
		}
		const n = 200_000
		p.A.call(frame.Frame{Op: frame.OpWrite, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Arg2: 1000, Payload: frame.AppendStaged(nil, 7, n)})
		for off := 0; off < n; off += frame.MaxPayload {
			k := min(frame.MaxPayload, n-off)
			m := p.B.call(frame.Frame{Op: frame.OpLocalRead, Handle: p.hb, Arg: r, Arg2: uint64(1000 + off), Payload: length(uint32(k))})
			if !bytes.Equal(m.Payload, mem[7+off:7+off+k]) {
				t.Fatalf("the region at %d after the staged Write: other bytes than the span's", 1000+off)
			}
		}
		p.B.call(frame.Frame{Op: frame.OpLocalWrite, Handle: p.hb, Arg: r, Arg2: size - 5, Payload: []byte("tail!")})
		m := p.A.call(frame.Frame{Op: frame.OpRead, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Arg2: size - n, Payload: frame.AppendStaged(nil, 50_000, n)})
		if len(m.Payload) != 0 {
			t.Fatalf("a staged Read's OK carries %d bytes", len(m.Payload))
		}
		if got := string(mem[50_000+n-5 : 50_000+n]); got != "tail!" {
			t.Fatalf("staging memory after the staged Read ends with %q", got)
		}
		for j := range 1000 { // region[size-n+j] came from staging[7+size-n-1000+j] before the Read
			if want := byte((7 + size - n - 1000 + j) * 13); mem[50_000+j] != want {
				t.Fatalf("staging memory after the staged Read, byte %d: %#x, want %#x (what the staged Write placed)", j, mem[50_000+j], want)
			}
		}
		p.A.call(frame.Frame{Op: frame.OpWrite, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Payload: frame.AppendStaged(nil, 0, 0)})
		p.A.fails(frame.Frame{Op: frame.OpRead, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Arg2: size - 1, Payload: frame.AppendStaged(nil, 0, 2)}, frame.CodeRegion)
	}},
}

// staged is a vconn's staging memory as the OK of Stage gave it.
type staged struct {
	fd   int
	size int
}

// stage asks for size bytes of staging memory on vconn h and checks the
// OK: one descriptor, a memfd of at least the size given.
func stage(t *testing.T, s *sess, h uint32, size uint64) staged {
	t.Helper()
	req := s.next()
	s.send(frame.Frame{Op: frame.OpStage, Req: req, Handle: h, Arg2: size})
	m := s.recvFDs(1)
	if m.Op != frame.OpOK || m.Req != req || m.Handle != h || m.Arg2 == 0 || m.Arg2 > size {
		t.Fatalf("Stage of %d bytes: %v", size, m)
	}
	st := staged{fd: int(m.fds[0].Fd()), size: int(m.Arg2)}
	var fs unix.Stat_t
	if err := unix.Fstat(st.fd, &fs); err != nil || fs.Size < int64(st.size) {
		t.Fatalf("the staging memfd: %d bytes, %v; want at least %d", fs.Size, err, st.size)
	}
	return st
}

// mmap maps the staging memory, unmapped at the end of the test.
func (st staged) mmap(t *testing.T) []byte {
	t.Helper()
	mem, err := unix.Mmap(st.fd, 0, st.size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(mem) })
	return mem
}
