package agent_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// openBeats opens n heartbeat streams on x, one after the other, each
// held open under ctx once answered, and counts those answered and those
// refused for the peer's stream limit.
func openBeats(t *testing.T, ctx context.Context, x controlpb.ControlClient, n int) (accepted, refused int) {
	t.Helper()
	for range n {
		s, err := x.Heartbeat(ctx)
		if err != nil {
			t.Fatalf("opening a heartbeat stream: %v", err)
		}
		// A stream refused may have ended before the beat is sent (EOF):
		// its status is Recv's.
		if err := s.Send(&controlpb.Beat{Seq: 1, Incarnation: 1}); err != nil && !errors.Is(err, io.EOF) {
			t.Fatalf("sending a beat: %v", err)
		}
		_, err = s.Recv()
		switch {
		case err == nil:
			accepted++
		case status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "streams in flight"):
			refused++
		default:
			t.Fatalf("beat on stream %d: %v, want an answer or ResourceExhausted naming the stream limit", accepted+refused, err)
		}
	}
	return accepted, refused
}

// TestPeerStreamFlood: node-x, with a valid certificate, opens 1,000
// heartbeat streams to node-a's control plane and holds them. node-a
// accepts at most its per-peer limit (figure: accepted streams <= 8, of
// 1,000), node-a and node-b keep beating each other (neither reports the
// other unreachable, their vconn echoes, a new one dials), and once the
// flood ends node-x gets its full limit of streams again (no count
// leaked).
func TestPeerStreamFlood(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TLS: true})
	a, b := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	ln, err := appClient(t, a, "srv", 8).Listen(ctx, ":7")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	cli := appClient(t, b, "cli", 8)
	old, err := cli.Dial(ctx, "node-a:7")
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	echoes(t, old, "before")

	x := hostile(t, a.Agent.ControlAddress(), certSource(t, cl.CA, "node-x", "127.0.0.9").Credentials())
	const n = 1000
	limit := agent.PeerStreamLimit()
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	accepted, refused := openBeats(t, fctx, x, n)
	t.Logf("node-x opened %d heartbeat streams: %d accepted, %d refused", n, accepted, refused)
	if accepted > limit {
		t.Errorf("%d of node-x's %d heartbeat streams accepted, want at most %d", accepted, n, limit)
	}
	// Past a heartbeat timeout (2 s) with the flood held open.
	time.Sleep(2500 * time.Millisecond)
	for _, nd := range cl.Nodes {
		if u := nd.Agent.Status().Unreachable; len(u) != 0 {
			t.Errorf("during the flood, %s reports %v unreachable", nd.Name, u)
		}
	}
	echoes(t, old, "during")
	c, err := cli.Dial(ctx, "node-a:7")
	if err != nil {
		t.Fatalf("dial node-a during the flood: %v", err)
	}
	echoes(t, c, "new")
	_ = c.Close()

	stop()
	poll.Until(t, 10*time.Second, "node-x's full stream limit accepted after the flood", func() bool {
		sctx, cancel := context.WithCancel(ctx)
		defer cancel()
		got, _ := openBeats(t, sctx, x, limit)
		return got == limit
	})
}

// stallQP is node-x's control plane: its ConnectQP never answers, which
// holds each Dial that node-a lets through until the call's deadline.
type stallQP struct {
	controlpb.UnimplementedControlServer
	mu       sync.Mutex
	inFlight int // ConnectQP calls waiting now
	most     int // the most waiting at once
}

func (m *stallQP) ConnectQP(ctx context.Context, _ *controlpb.QPRequest) (*controlpb.QPReply, error) {
	m.mu.Lock()
	m.inFlight++
	m.most = max(m.most, m.inFlight)
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	m.inFlight--
	m.mu.Unlock()
	return nil, ctx.Err()
}

// TestPeerCallFlood: node-x, with a valid certificate, sends node-a 16
// Dials at once to a listener, each of which node-a works on until node-x's
// ConnectQP answers, which it never does. With the per-peer limit of
// unary calls in flight at 4, node-a refuses the rest at once (figure:
// Dials refused for the limit >= 12 of 16), and once they end node-x's
// calls are served again.
func TestPeerCallFlood(t *testing.T) {
	const limit, dials = 4, 16
	agent.SetPeerLimits(t, agent.PeerStreamLimit(), limit)
	cl := startCluster(t, agenttest.Options{TLS: true})
	a := cl.Nodes[0]
	ctx := ctxT(t)
	stall, x, caller := stallingNodeX(t, cl)
	vln, err := appClient(t, a, "victim", 64).Listen(ctx, ":8")
	if err != nil {
		t.Fatal(err)
	}
	defer vln.Close()
	go agenttest.ServeDiscard(vln)
	refused := stalledDials(t, ctx, x, caller, dials)
	stall.mu.Lock()
	most := stall.most
	stall.mu.Unlock()
	t.Logf("%d Dials at once: %d refused for the limit of %d calls in flight; at most %d ConnectQP waited at node-x", dials, refused, limit, most)
	if refused < dials-limit {
		t.Errorf("%d of %d Dials refused for the per-peer limit, want at least %d", refused, dials, dials-limit)
	}
	// Once they ended, node-x has its whole limit again: none leaked.
	poll.Until(t, 10*time.Second, "node-x's full call limit let in after the flood", func() bool {
		return stalledDials(t, ctx, x, caller, dials) == dials-limit
	})
}

// stalledDials sends n Dials at once from caller, each from a pod IP of
// its own, to port 8, each given 3 s, and counts those refused for the
// peer's limit of calls in flight.
func stalledDials(t *testing.T, ctx context.Context, x controlpb.ControlClient, caller *controlpb.Node, n int) (refused int) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, errs[i] = x.Dial(cctx, &controlpb.DialRequest{Caller: caller, Port: 8, Vconn: uint32(0x501 + i),
				FromIp: net.IPv4(10, 9, 0, byte(i)).To4()})
		})
	}
	wg.Wait()
	for _, err := range errs {
		if status.Code(err) == codes.ResourceExhausted && strings.Contains(status.Convert(err).Message(), "calls in flight") {
			refused++
		} else if status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Unavailable {
			t.Errorf("a Dial: %v, want one refused for the limit or left to wait", err)
		}
	}
	return refused
}

// stallingNodeX serves node-x's control plane as stallQP, with a valid
// certificate, and returns it, a client of node-a's control plane with
// node-x's certificate, and node-x's Node as it claims itself there.
func stallingNodeX(t *testing.T, cl *agenttest.Cluster) (*stallQP, controlpb.ControlClient, *controlpb.Node) {
	t.Helper()
	xln, err := net.Listen("tcp", "127.0.0.9:0")
	if err != nil {
		t.Fatal(err)
	}
	xSrc := certSource(t, cl.CA, "node-x", "127.0.0.9")
	stall := &stallQP{}
	srv := grpc.NewServer(grpc.Creds(xSrc.Credentials()))
	controlpb.RegisterControlServer(srv, stall)
	go func() { _ = srv.Serve(xln) }()
	t.Cleanup(srv.Stop)
	x := hostile(t, cl.Nodes[0].Agent.ControlAddress(), xSrc.Credentials())
	return stall, x, &controlpb.Node{Name: "node-x", ControlAddress: xln.Addr().String(), Gid: mappedGID("127.0.0.9"), Incarnation: 1}
}

// TestDialDeadline: node-x dials a listener on node-a with no deadline of
// its own and never answers node-a's ConnectQP; node-a gives up on the
// Dial within dialTimeout (10 s) rather than holding the listener's quota
// slot and the call for as long as node-x likes (figure: the Dial answered
// within 15 s).
func TestDialDeadline(t *testing.T) {
	cl := startCluster(t, agenttest.Options{TLS: true})
	a := cl.Nodes[0]
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, x, caller := stallingNodeX(t, cl)
	vln, err := appClient(t, a, "victim", 4).Listen(ctx, ":8")
	if err != nil {
		t.Fatal(err)
	}
	defer vln.Close()
	go agenttest.ServeDiscard(vln)
	start := time.Now()
	_, err = x.Dial(ctx, &controlpb.DialRequest{Caller: caller, Port: 8, Vconn: 0x501})
	took := time.Since(start)
	t.Logf("a Dial without a deadline, node-x never answering ConnectQP: %v after %v", err, took.Round(time.Millisecond))
	if err == nil || took > 15*time.Second {
		t.Errorf("Dial answered %v after %v, want an error within 15 s", err, took)
	}
}
