package agent

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
)

// silentPeer accepts heartbeat streams and never answers: a hung agent.
type silentPeer struct {
	controlpb.UnimplementedControlServer
}

func (silentPeer) Heartbeat(stream grpc.BidiStreamingServer[controlpb.Beat, controlpb.Beat]) error {
	for {
		if _, err := stream.Recv(); err != nil {
			return nil
		}
	}
}

// TestHeartbeatTimeout: a peer that keeps its connection but stops
// answering is declared gone after the timeout, not never.
func TestHeartbeatTimeout(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	controlpb.RegisterControlServer(srv, silentPeer{})
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()
	conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := &remote{a: &Agent{log: logr.Discard(), incarnation: 1}, addr: ln.Addr().String(), conn: conn, cl: controlpb.NewControlClient(conn)}
	start := time.Now()
	err = r.beatOnce(context.Background(), 20*time.Millisecond, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no heartbeat") {
		t.Fatalf("beatOnce: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("declared gone after %v", d)
	}
}
