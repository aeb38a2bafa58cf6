package protocol

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// goesOn: after an error the session still answers, and its vconn (if
// any) still works.
func (p *pair) goesOn(t *testing.T) {
	t.Helper()
	p.A.alive()
	p.A.sendMsg(p.ha, []byte("still open"))
}

// §8 Every error, and whether the session survives it.
var errorCases = []conformanceCase{
	{"R8.1", "a datagram that fails a check: BadRequest (req from bytes 4..7, or 0), the session ends", rc, false, func(t *testing.T, e *env) {
		s := open(t, "A", alloc(t, e.a, 1))
		s.sendRaw([]byte{1, 4, 0, 0, 0})
		s.endsWith(0, frame.CodeBadRequest)
		s = open(t, "A", alloc(t, e.a, 1))
		s.sendRaw(helloBytes(0x0a0b0c0d)[:20])
		s.endsWith(0x0a0b0c0d, frame.CodeBadRequest)
		s = open(t, "A", alloc(t, e.a, 1))
		s.sendRaw(make([]byte, frame.MaxFrame+1)) // larger than any frame
		s.endsWith(0, frame.CodeBadRequest)
	}},
	{"R8.2", "a first frame other than Hello: BadRequest, the session ends", rc, false, func(t *testing.T, e *env) {
		s := dial(t, "A", alloc(t, e.a, 1))
		s.send(frame.Frame{Op: frame.OpDial, Req: 7, Payload: []byte("node-b:80")})
		s.endsWith(7, frame.CodeBadRequest)
	}},
	{"R8.3", "Hello of another version: Version naming the agent's, the session ends", rc, false, func(t *testing.T, e *env) {
		s := dial(t, "A", alloc(t, e.a, 1))
		s.send(frame.Frame{Op: frame.OpHello, Req: 3, Arg: 2})
		if m := s.endsWith(3, frame.CodeVersion); !strings.Contains(string(m.Payload), "1") {
			t.Fatalf("the reason %q does not name version 1", m.Payload)
		}
	}},
	{"R8.4", "a frame whose op is no request: BadRequest, the session ends", rc, false, func(t *testing.T, e *env) {
		for _, op := range []frame.Op{frame.OpOK, frame.OpError, frame.OpData, frame.OpEOF, frame.OpAccept} {
			s := open(t, "A", alloc(t, e.a, 1))
			s.send(frame.Frame{Op: op, Req: 5})
			s.endsWith(5, frame.CodeBadRequest)
		}
	}},
	{"R8.5", "a request other than Grant with req 0: BadRequest, req 0, handle 0, the session ends", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for _, op := range requests {
			if op == frame.OpGrant {
				continue
			}
			s := open(t, "A", alloc(t, e.a, 1))
			f := frame.Frame{Op: op, Arg: 1}
			switch op {
			case frame.OpDial:
				f.Payload = []byte(p.addr)
			case frame.OpListen:
				f.Arg = port()
			case frame.OpHello:
			default:
				f.Handle = 1
			}
			s.send(f)
			s.endsWith(0, frame.CodeBadRequest)
		}
		p.goesOn(t)
	}},
	{"R8.6", "a Grant on handle 0: BadRequest, req 0, handle 0, the session ends", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.send(frame.Frame{Op: frame.OpGrant, Arg: 1})
		p.A.endsWith(0, frame.CodeBadRequest)
		s := open(t, "A2", p.A.sock)
		s.send(frame.Frame{Op: frame.OpGrant, Req: 4242, Arg: 1})
		s.endsWith(0, frame.CodeBadRequest)
	}},
	{"R8.7", "a session past limits.sessions: Limit to its first frame, the session ends; the others go on", rc, false, func(t *testing.T, e *env) {
		sock := alloc(t, e.a, 1)
		var ss []*sess
		for range limitSessions {
			ss = append(ss, open(t, "A", sock))
		}
		s := dial(t, "A", sock)
		s.send(frame.Frame{Op: frame.OpHello, Req: 6, Arg: frame.Version})
		s.endsWith(6, frame.CodeLimit)
		for _, s := range ss {
			s.alive()
		}
	}},
	{"R8.8", "a handle the session does not have: NoHandle, echoing req and handle; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for _, f := range []frame.Frame{
			{Op: frame.OpSend, Payload: []byte("x")},
			{Op: frame.OpClose},
			{Op: frame.OpExport, Arg: 3, Arg2: 64},
			{Op: frame.OpUnexport, Arg: 1},
			{Op: frame.OpLocalRead, Arg: 1, Payload: length(1)},
			{Op: frame.OpLocalWrite, Arg: 1, Payload: []byte("x")},
			{Op: frame.OpWrite, Arg: 1, Payload: []byte("x")},
			{Op: frame.OpRead, Arg: 1, Payload: length(1)},
			{Op: frame.OpShm},
		} {
			f.Handle = 999
			p.A.fails(f, frame.CodeNoHandle)
		}
		p.A.fails(frame.Frame{Op: frame.OpClose, Handle: 0}, frame.CodeNoHandle)
		p.goesOn(t)
	}},
	{"R8.9", "a Grant on a handle the session does not have: a NoHandle push, req 0; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.send(frame.Frame{Op: frame.OpGrant, Req: 4242, Handle: 999, Arg: 1})
		if m := p.A.recv(); m.Op != frame.OpError || m.Req != 0 || m.Handle != 999 || frame.Code(m.Arg) != frame.CodeNoHandle {
			t.Fatalf("got %v, want an Error push: req 0, handle 999, CodeNoHandle", m)
		}
		p.goesOn(t)
	}},
	{"R8.10", "Listen on port 0 or above 65535: BadRequest; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.fails(frame.Frame{Op: frame.OpListen, Arg: 0}, frame.CodeBadRequest)
		p.A.fails(frame.Frame{Op: frame.OpListen, Arg: 65536}, frame.CodeBadRequest)
		p.goesOn(t)
	}},
	{"R8.11", "Listen on a port taken in the port space: AddrInUse; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		port := strings.TrimPrefix(p.addr, "node-b:")
		var n uint32
		fmt.Sscan(port, &n)
		other := open(t, "B2", alloc(t, e.b, 1)) // host services share the node's ports
		other.fails(frame.Frame{Op: frame.OpListen, Arg: n}, frame.CodeAddrInUse)
		pod := open(t, "pod", podAlloc(t, e.b, "10.244.9.4", 1)) // a pod has its own
		pod.listen(n)
		other.alive()
	}},
	{"R8.12", "Listen past limits.listeners: Limit; the session goes on", rc, false, func(t *testing.T, e *env) {
		s := open(t, "A", alloc(t, e.a, 1))
		for range limitListeners {
			s.listen(port())
		}
		s.fails(frame.Frame{Op: frame.OpListen, Arg: port()}, frame.CodeLimit)
		s.alive()
	}},
	{"R8.13", "Listen or Dial of a pod's allocation whose pod is not known: NoAddress after 5 s; the session goes on", rc, true, func(t *testing.T, e *env) {
		al, err := e.a.Agent.CreatePodAllocation(fmt.Sprintf("unbound%d", allocs.Add(1)), 2)
		if err != nil {
			t.Fatal(err)
		}
		s := open(t, "A", al.Socket)
		start := time.Now()
		s.send(frame.Frame{Op: frame.OpListen, Req: 2, Arg: 80})
		s.send(frame.Frame{Op: frame.OpDial, Req: 3, Payload: []byte("node-b:80")})
		got := map[uint32]msg{}
		for range 2 {
			m := s.recv()
			got[m.Req] = m
		}
		for req, m := range got {
			if m.Op != frame.OpError || frame.Code(m.Arg) != frame.CodeNoAddress || (req != 2 && req != 3) {
				t.Fatalf("got %v, want CodeNoAddress", m)
			}
		}
		if d := time.Since(start); d < 4*time.Second {
			t.Fatalf("NoAddress after %v: the agent did not wait for the pod", d)
		}
		s.alive()
	}},
	{"R8.14", "Dial of an address that is no host:port: BadRequest; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for _, addr := range []string{"node-b", "node-b:", "node-b:0", "node-b:65536", "node-b:x", ":80", ""} {
			p.A.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(addr)}, frame.CodeBadRequest)
		}
		p.goesOn(t)
	}},
	{"R8.15", "Dial of a host that is no IP and no node: UnknownHost; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.fails(frame.Frame{Op: frame.OpDial, Payload: []byte("nowhere.example:80")}, frame.CodeUnknownHost)
		p.goesOn(t)
	}},
	{"R8.16", "Dial of an IP no node serves: Unreachable after 2 s; the session goes on", rc, true, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.fails(frame.Frame{Op: frame.OpDial, Payload: []byte("10.99.0.1:80")}, frame.CodeUnreachable)
		p.goesOn(t)
	}},
	{"R8.17", "Dial of a port nothing listens on: Refused; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(fmt.Sprintf("node-b:%d", port()))}, frame.CodeRefused)
		p.goesOn(t)
	}},
	{"R8.18", "Dial with the allocation's vconns all in use: Quota; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a := open(t, "A1", alloc(t, e.a, 1))
		a.dialVConn(p.addr)
		a.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(p.addr)}, frame.CodeQuota)
		a.alive()
	}},
	{"R8.19", "Dial to a listener whose allocation is full: Quota; the listener hears nothing", rc, false, func(t *testing.T, e *env) {
		b := open(t, "B", alloc(t, e.b, 1))
		port := port()
		l := b.listen(port)
		addr := fmt.Sprintf("node-b:%d", port)
		a := open(t, "A", alloc(t, e.a, 4))
		a.dialVConn(addr)
		b.accept(l)
		a.fails(frame.Frame{Op: frame.OpDial, Payload: []byte(addr)}, frame.CodeQuota)
		b.expectQuiet(500 * time.Millisecond)
		a.alive()
	}},
	{"R8.20", "a bridged Dial or Listen on ud: BadRequest before any listener hears of it; the session goes on", ud, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		req := p.A.next()
		p.A.send(frame.Frame{Op: frame.OpDial, Req: req, Flags: frame.FlagBridge, Payload: []byte(p.addr)})
		p.A.expectErr(req, 0, frame.CodeBadRequest) // and no descriptor (recv)
		p.B.expectQuiet(time.Second)
		p.B.fails(frame.Frame{Op: frame.OpListen, Flags: frame.FlagBridge, Arg: port()}, frame.CodeBadRequest)
		if n := inUse(e.a, p.A.sock); n != 1 {
			t.Fatalf("the dialler's allocation holds %d vconns, want 1 (the plain one)", n)
		}
		p.goesOn(t)
		p.B.alive()
	}},
	{"R8.21", "a Send larger than the vconn's max message: TooLarge with its req; the vconn stays open", ud, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a := open(t, "A2", alloc(t, e.a, 2))
		v := a.dialVConn(p.addr)
		max := uint32(v.Arg2)
		hb := p.B.accept(p.l).Arg
		a.fails(frame.Frame{Op: frame.OpSend, Handle: v.Handle, Payload: make([]byte, max+1)}, frame.CodeTooLarge)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: hb, Arg: 1})
		a.sendMsg(v.Handle, bytes.Repeat([]byte{1}, int(max)))
		if m := p.B.data(hb); len(m.Payload) != int(max) {
			t.Fatalf("a message of the max: %d bytes arrived", len(m.Payload))
		}
	}},
	{"R8.22", "an operation past the send window: Window, and it is not run", rc, false, func(t *testing.T, e *env) {
		w := stallSends(t, e)
		if w.refused == 0 {
			t.Fatal("no operation was refused past the window")
		}
		// The refused sends never reach the peer: it receives the sends
		// answered OK and those still pending, no more.
		ok := 0
		for _, m := range w.answered {
			if m.Op == frame.OpOK {
				ok++
			}
		}
		w.p.B.send(frame.Frame{Op: frame.OpGrant, Handle: w.p.hb, Arg: 1 << 20})
		for range ok + w.pending {
			w.p.B.data(w.p.hb)
		}
		w.p.B.expectQuiet(time.Second) // and no more: the refused were not run
		for range w.pending {
			if m := w.p.A.recv(); m.Op != frame.OpOK || m.Handle != w.p.ha {
				t.Fatalf("got %v, want the OKs of the sends that waited", m)
			}
		}
		w.p.A.alive()
	}},
	{"R8.23", "an operation past limits.queuedBytes: Limit, and every later one with a payload on that vconn", queued, false, func(t *testing.T, e *env) {
		p := newPair(t, e) // node-a's allocations have the least queued bytes; B never grants
		a := p.A
		limited := false
		for i := 0; i < 2000 && !limited; i++ {
			req := a.next()
			a.send(frame.Frame{Op: frame.OpSend, Req: req, Handle: p.ha, Payload: make([]byte, 32<<10)})
			for {
				m, err := a.read(300 * time.Millisecond)
				if err != nil {
					break // it waits in the agent: send more
				}
				if m.Op == frame.OpError {
					if frame.Code(m.Arg) != frame.CodeLimit {
						t.Fatalf("got %v, want CodeLimit", m)
					}
					limited = true
					break
				}
				if m.Req == req {
					break
				}
			}
		}
		if !limited {
			t.Fatal("sends to a peer that reads nothing never met limits.queuedBytes")
		}
		a.fails(frame.Frame{Op: frame.OpSend, Handle: p.ha, Payload: []byte{1}}, frame.CodeLimit)
		a.fails(frame.Frame{Op: frame.OpLocalWrite, Handle: p.ha, Arg: 1, Payload: []byte{1}}, frame.CodeLimit)
		a.alive()
	}},
	{"R8.24", "Export of 0 bytes: BadRequest; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.fails(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 0}, frame.CodeBadRequest)
		p.goesOn(t)
	}},
	{"R8.25", "Export of more than maxMessageBytes: TooLarge; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.fails(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 1<<20 + 1}, frame.CodeTooLarge)
		p.A.fails(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 1 << 63}, frame.CodeTooLarge)
		p.goesOn(t)
	}},
	{"R8.26", "Export with an access other than 1, 2 or 3: BadRequest; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for _, access := range []uint32{0, 4, 0x103, 0x80000001} {
			p.A.fails(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: access, Arg2: 64}, frame.CodeBadRequest)
		}
		p.goesOn(t)
	}},
	{"R8.27", "Export past limits.regions: Limit; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		for range limitRegions {
			p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64})
		}
		p.A.fails(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}, frame.CodeLimit)
		p.goesOn(t)
	}},
	{"R8.28", "LocalRead or Read without a 4-byte length: BadRequest; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		r := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 64}).Arg
		for _, pl := range [][]byte{nil, {0, 0, 1}, {0, 0, 0, 1, 0}} {
			p.A.fails(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Payload: pl}, frame.CodeBadRequest)
			p.B.fails(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Payload: pl}, frame.CodeBadRequest)
		}
		p.goesOn(t)
	}},
	{"R8.29", "LocalRead or Read of more than 65,536 bytes: TooLarge; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		r := p.A.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 3, Arg2: 1 << 20}).Arg
		p.A.fails(frame.Frame{Op: frame.OpLocalRead, Handle: p.ha, Arg: r, Payload: length(frame.MaxPayload + 1)}, frame.CodeTooLarge)
		p.B.fails(frame.Frame{Op: frame.OpRead, Handle: p.hb, Arg: r, Payload: length(frame.MaxPayload + 1)}, frame.CodeTooLarge)
		p.goesOn(t)
	}},
	{"R8.30", "a region missing, out of bounds or not allowed: Region; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		a, b := p.A, p.B
		r := a.call(frame.Frame{Op: frame.OpExport, Handle: p.ha, Arg: 1, Arg2: 64}).Arg
		a.sendMsg(p.ha, nil)
		b.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 1})
		b.data(p.hb)
		for _, f := range []frame.Frame{
			{Op: frame.OpLocalRead, Arg: r + 1, Payload: length(1)},
			{Op: frame.OpLocalRead, Arg: r, Arg2: 65, Payload: length(0)},
			{Op: frame.OpLocalRead, Arg: r, Arg2: 60, Payload: length(5)},
			{Op: frame.OpLocalWrite, Arg: r, Arg2: 62, Payload: []byte("abc")},
			{Op: frame.OpUnexport, Arg: r + 1},
		} {
			f.Handle = p.ha
			a.fails(f, frame.CodeRegion)
		}
		for _, f := range []frame.Frame{
			{Op: frame.OpRead, Arg: r + 1, Payload: length(1)},
			{Op: frame.OpRead, Arg: r, Arg2: 60, Payload: length(5)},
			{Op: frame.OpWrite, Arg: r, Payload: []byte("read-only")},
		} {
			f.Handle = p.hb
			b.fails(f, frame.CodeRegion)
		}
		p.goesOn(t)
		b.alive()
	}},
	{"R8.31", "Shm after a Grant, or a second Shm: BadRequest; the vconn stays as it was", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 4})
		p.B.fails(frame.Frame{Op: frame.OpShm, Handle: p.hb}, frame.CodeBadRequest)
		p.A.sendMsg(p.ha, []byte("on the socket"))
		if m := p.B.data(p.hb); string(m.Payload) != "on the socket" {
			t.Fatalf("got %q", m.Payload)
		}
		openShm(t, p.A, p.ha)
		p.A.fails(frame.Frame{Op: frame.OpShm, Handle: p.ha}, frame.CodeBadRequest)
		p.A.alive()
	}},
	{"R8.32", "operations still queued when the vconn is closed: Closed; none goes unanswered", rc, false, func(t *testing.T, e *env) {
		w := stallSends(t, e)
		a := w.p.A
		req := a.next()
		a.send(frame.Frame{Op: frame.OpClose, Req: req, Handle: w.p.ha})
		closed, ok := 0, false
		for !ok || closed < w.pending {
			m := a.recv()
			switch {
			case m.Req == req && m.Op == frame.OpOK:
				ok = true
			case m.Op == frame.OpError && frame.Code(m.Arg) == frame.CodeClosed && m.Handle == w.p.ha:
				closed++
			case m.Op == frame.OpOK && m.Handle == w.p.ha:
				closed++ // taken by the engine as the close came
			default:
				t.Fatalf("got %v, want the queued sends' answers and the Close's OK", m)
			}
		}
		a.expectQuiet(300 * time.Millisecond)
		a.alive()
	}},
	{"R8.33", "sends to a vconn its peer closed: the sender's vconn is reset (replies, then a push if its EOF was not pushed)", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		// B granted: its EOF is pushed, then its Sends fail Reset.
		p.B.send(frame.Frame{Op: frame.OpGrant, Handle: p.hb, Arg: 4})
		p.A.call(frame.Frame{Op: frame.OpClose, Handle: p.ha})
		if m := p.B.recv(); m.Op != frame.OpEOF {
			t.Fatalf("got %v, want EOF", m)
		}
		resetByPeer(t, p.B, p.hb)
		p.B.expectQuiet(300 * time.Millisecond)
		// Not granted: the reset is pushed where the EOF would have been.
		q := newPair(t, e)
		q.A.call(frame.Frame{Op: frame.OpClose, Handle: q.ha})
		resetByPeer(t, q.B, q.hb)
		q.B.send(frame.Frame{Op: frame.OpGrant, Handle: q.hb, Arg: 1})
		if m := q.B.recv(); m.Op != frame.OpError || m.Req != 0 || m.Handle != q.hb || frame.Code(m.Arg) != frame.CodeReset {
			t.Fatalf("got %v, want an Error push CodeReset", m)
		}
		q.B.alive()
	}},
	{"R8.34", "the peer's node gone: its vconns fail PeerGone; the session goes on", "", false, func(t *testing.T, e *env) {
		cl := ownCluster(t, agenttest.Options{VConnsPerNode: 100, HeartbeatTimeout: 2 * time.Second})
		e = &env{cl: cl, a: cl.Nodes[0], b: cl.Nodes[1]}
		p := newPair(t, e)
		p.A.send(frame.Frame{Op: frame.OpGrant, Handle: p.ha, Arg: 4})
		if err := e.b.Stop(); err != nil {
			t.Fatal(err)
		}
		m, err := p.A.read(30 * time.Second)
		if err != nil || m.Op != frame.OpError || m.Req != 0 || m.Handle != p.ha || frame.Code(m.Arg) != frame.CodePeerGone {
			t.Fatalf("got %v, %v; want an Error push CodePeerGone", m, err)
		}
		p.A.fails(frame.Frame{Op: frame.OpSend, Handle: p.ha, Payload: []byte("x")}, frame.CodePeerGone)
		p.A.alive()
	}},
	{"R8.35", "Stage of 0 bytes, or a second Stage: BadRequest; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		p.A.fails(frame.Frame{Op: frame.OpStage, Handle: p.ha}, frame.CodeBadRequest)
		stage(t, p.A, p.ha, 4096)
		p.A.fails(frame.Frame{Op: frame.OpStage, Handle: p.ha, Arg2: 4096}, frame.CodeBadRequest)
		p.goesOn(t)
	}},
	{"R8.36", "a staged Write or Read without staging memory, with a payload not of 8 bytes, or a span outside it: BadRequest; the session goes on", rc, false, func(t *testing.T, e *env) {
		p := newPair(t, e)
		r := p.B.call(frame.Frame{Op: frame.OpExport, Handle: p.hb, Arg: 3, Arg2: 8192}).Arg
		p.B.sendMsg(p.hb, nil)
		p.A.send(frame.Frame{Op: frame.OpGrant, Handle: p.ha, Arg: 1})
		p.A.data(p.ha)
		p.A.fails(frame.Frame{Op: frame.OpWrite, Flags: frame.FlagMemfd, Handle: p.ha, Arg: r, Payload: frame.AppendStaged(nil, 0, 1)}, frame.CodeBadRequest)
		stage(t, p.A, p.ha, 4096)
		for _, f := range []frame.Frame{
			{Op: frame.OpWrite, Payload: []byte("1234567")},
			{Op: frame.OpRead, Payload: length(1)},
			{Op: frame.OpWrite, Payload: frame.AppendStaged(nil, 4000, 97)},
			{Op: frame.OpRead, Payload: frame.AppendStaged(nil, 4097, 0)},
			{Op: frame.OpRead, Payload: frame.AppendStaged(nil, 1, 1<<32-1)},
		} {
			f.Flags, f.Handle, f.Arg = frame.FlagMemfd, p.ha, r
			p.A.fails(f, frame.CodeBadRequest)
		}
		p.goesOn(t)
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
