package agent

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/frame"
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
	beating, err := r.beatOnce(context.Background(), 20*time.Millisecond, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no heartbeat") {
		t.Fatalf("beatOnce: %v", err)
	}
	if beating {
		t.Errorf("beatOnce says the silent peer answered")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("declared gone after %v", d)
	}
}

// TestCodeOfControlErrors: a peer agent's gRPC status reaches the
// application as the protocol's code through statusError and codeOf, also
// wrapped, with its message unchanged; engine classes still come first.
func TestCodeOfControlErrors(t *testing.T) {
	for _, tc := range []struct {
		code codes.Code
		want frame.Code
	}{
		{codes.NotFound, frame.CodeRefused},
		{codes.ResourceExhausted, frame.CodeQuota},
		{codes.Unavailable, frame.CodeUnreachable},
		{codes.DeadlineExceeded, frame.CodeUnreachable},
		{codes.InvalidArgument, frame.CodeBadRequest},
		{codes.FailedPrecondition, frame.CodeInternal},
		{codes.Internal, frame.CodeInternal},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			err := status.Error(tc.code, "peer says no")
			got := statusError(err)
			if got.Error() != err.Error() {
				t.Errorf("message %q, want %q", got.Error(), err.Error())
			}
			if c := codeOf(got); c != tc.want {
				t.Errorf("codeOf: %v, want %v", c, tc.want)
			}
			if c := codeOf(fmt.Errorf("dial: %w", got)); c != tc.want {
				t.Errorf("codeOf wrapped: %v, want %v", c, tc.want)
			}
			if c := codeOf(fmt.Errorf("%w: %w", engine.ErrPeerGone, got)); c != frame.CodePeerGone {
				t.Errorf("codeOf with ErrPeerGone: %v, want %v", c, frame.CodePeerGone)
			}
		})
	}
	if err := statusError(nil); err != nil {
		t.Errorf("statusError(nil) = %v", err)
	}
	// A stream the peer closed past a lost message is broken, as one it
	// reset: the program must not take it for a whole one.
	if c := codeOf(fmt.Errorf("recv: %w", engine.ErrLost)); c != frame.CodeReset {
		t.Errorf("codeOf(ErrLost): %v, want %v", c, frame.CodeReset)
	}
}
