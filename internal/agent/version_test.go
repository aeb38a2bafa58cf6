package agent_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// TestControlProtocolVersions: a peer's calls carry the control-plane
// versions it speaks. One that shares none with this agent is refused,
// FailedPrecondition, naming both ranges; one from before versions were
// carried (none sent: version 1) and one of the next release (1..2) are
// served; this agent's own answer says its range.
func TestControlProtocolVersions(t *testing.T) {
	c, err := agenttest.Start(agenttest.Options{Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h := hostile(t, c.Nodes[0].Agent.ControlAddress(), insecure.NewCredentials())
	b := c.Nodes[1]
	caller := func(lo, hi uint32) *controlpb.Node {
		gid := mappedGID(b.IP)
		return &controlpb.Node{Name: b.Name, ControlAddress: b.Agent.ControlAddress(), Gid: gid, Incarnation: 77, MinProtocol: lo, MaxProtocol: hi}
	}
	for _, tc := range []struct {
		lo, hi uint32
		ok     bool
	}{{0, 0, true}, {1, 1, true}, {1, 2, true}, {agent.ProtocolMax + 1, agent.ProtocolMax + 2, false}, {3, 2, false}} {
		rep, err := h.Identity(ctx, &controlpb.IdentityRequest{Caller: caller(tc.lo, tc.hi)})
		switch {
		case tc.ok && err != nil:
			t.Errorf("a caller of versions %d..%d: %v, want served", tc.lo, tc.hi, err)
		case tc.ok && (rep.GetNode().GetMinProtocol() != agent.ProtocolMin || rep.GetNode().GetMaxProtocol() != agent.ProtocolMax):
			t.Errorf("the answer says versions %d..%d, want %d..%d", rep.GetNode().GetMinProtocol(), rep.GetNode().GetMaxProtocol(), agent.ProtocolMin, agent.ProtocolMax)
		case !tc.ok && (status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "control protocol versions")):
			t.Errorf("a caller of versions %d..%d: %v, want FailedPrecondition naming the versions", tc.lo, tc.hi, err)
		}
	}
}

// TestHelloVersions: the agent serves a Hello of any version it speaks
// (frame.MinVersion..Version) and answers with that version; it refuses
// another with CodeVersion, naming its range.
func TestHelloVersions(t *testing.T) {
	c, err := agenttest.Start(agenttest.Options{Log: logr.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sock, err := c.Nodes[0].Allocate(ctx, "hello-versions", 1)
	if err != nil {
		t.Fatal(err)
	}
	for v := uint32(0); v <= frame.Version+1; v++ {
		rep := rawHello(t, sock, v)
		want := v >= frame.MinVersion && v <= frame.Version
		switch {
		case want && (rep.Op != frame.OpOK || rep.Arg != v):
			t.Errorf("Hello of version %d: %v arg %d, want OK of version %d", v, rep.Op, rep.Arg, v)
		case !want && (rep.Op != frame.OpError || frame.Code(rep.Arg) != frame.CodeVersion || !strings.Contains(string(rep.Payload), "this agent speaks")):
			t.Errorf("Hello of version %d: %v %d %q, want CodeVersion naming the agent's versions", v, rep.Op, rep.Arg, rep.Payload)
		}
	}
}

// rawHello says a Hello of version v on a new connection to sock and
// returns the answer.
func rawHello(t *testing.T, sock string, v uint32) frame.Frame {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return rawRequest(t, c, frame.Frame{Op: frame.OpHello, Req: 1, Arg: v})
}
