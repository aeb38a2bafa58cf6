package agent_test

import (
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// TestSendWindowExact: a client that pipelines sends to a peer that never
// reads has exactly SendWindow of them unanswered once the engine stops
// taking them, never one more (the one the worker runs counts); each send
// past it is refused with the window code at once; and when the vconn is
// closed, every send still queued is answered (none waits for ever).
func TestSendWindowExact(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TuneEngine: func(c *engine.Config) { c.Credits = 8 }})
	ctx := ctxT(t)
	a, b := cl.Nodes[0], cl.Nodes[1]
	listenNeverRead(t, b, ":9")
	sock, err := a.Allocate(ctx, "pod", 2)
	if err != nil {
		t.Fatal(err)
	}
	r, h := rawVConn(t, sock, "node-b:9")
	answered := map[uint32]frame.Frame{}
	// drain reads answers until none comes for quiet.
	drain := func(quiet time.Duration) {
		buf := make([]byte, frame.MaxFrame)
		for {
			_ = r.c.SetReadDeadline(time.Now().Add(quiet))
			n, err := r.c.Read(buf)
			if err != nil {
				return
			}
			f, err := frame.Decode(buf[:n])
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := answered[f.Req]; dup {
				t.Fatalf("request %d answered twice", f.Req)
			}
			f.Payload = append([]byte(nil), f.Payload...)
			answered[f.Req] = f
		}
	}
	next := uint32(100)
	round := func() {
		for range 2 * agent.SendWindow {
			r.send(frame.Frame{Op: frame.OpSend, Req: next, Handle: h, Payload: make([]byte, 16<<10)})
			next++
		}
		drain(time.Second)
	}
	// Rounds of twice the window, until the engine stops taking sends
	// (some stay unanswered), then one more: the window is full.
	for i := 0; i < 300 && int(next-100) == len(answered); i++ {
		round()
	}
	if int(next-100) == len(answered) {
		t.Fatal("sends to a peer that reads nothing were all answered")
	}
	round()
	refused := 0
	for _, f := range answered {
		if f.Op == frame.OpError {
			if frame.Code(f.Arg) != frame.CodeWindow {
				t.Fatalf("send %d: %v %s, want the window code", f.Req, frame.Code(f.Arg), f.Payload)
			}
			refused++
		}
	}
	if refused < agent.SendWindow {
		t.Fatalf("%d sends refused, want at least the last round's past the window", refused)
	}
	sent := int(next - 100)
	if pending := sent - len(answered); pending != agent.SendWindow {
		t.Fatalf("%d sends unanswered once the engine stopped taking them, want SendWindow (%d)", pending, agent.SendWindow)
	}
	// Close: every queued send is answered, then the close.
	r.send(frame.Frame{Op: frame.OpClose, Req: 50, Handle: h})
	drain(3 * time.Second)
	for req := uint32(100); req < next; req++ {
		if _, ok := answered[req]; !ok {
			t.Errorf("send %d never answered after the close", req)
		}
	}
	if f, ok := answered[50]; !ok || f.Op != frame.OpOK {
		t.Errorf("close: %+v", f)
	}
}
