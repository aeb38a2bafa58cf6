// Package echotest is what the tests of the echo examples in other
// languages (examples/echo-c, examples/echo-py) and the end-to-end suite
// share: the verdict an echo client writes, as examples/echo defines it,
// and two agents holding a server's and a client's allocation.
package echotest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
)

// Verdict is what an echo client's --verdict writes: whether every
// message came back, and if not why, and when the client knew; how many
// messages it sent and how many came back intact. examples/echo numbers
// its messages and says too what became of the others (its Verdict, of
// which this is a copy): failed with an error the client was told,
// vanished with none, duplicated, reordered, corrupt; the other
// languages' clients leave those out.
type Verdict struct {
	OK         bool      `json:"ok"`
	Error      string    `json:"error"`
	At         time.Time `json:"at"`
	Sent       int64     `json:"sent"`
	Delivered  int64     `json:"delivered"`
	Failed     int64     `json:"failed,omitzero"`
	Vanished   int64     `json:"vanished,omitzero"`
	Duplicated int64     `json:"duplicated,omitzero"`
	Reordered  int64     `json:"reordered,omitzero"`
	Corrupt    int64     `json:"corrupt,omitzero"`
	VConns     []VConn   `json:"vconns,omitempty"`
}

// VConn is what became of one vconn's messages, by number
// (examples/echo's VConn).
type VConn struct {
	ID         int     `json:"id"`
	Sent       int64   `json:"sent"`
	Delivered  int64   `json:"delivered"`
	Failed     Numbers `json:"failed,omitzero"`
	Vanished   Numbers `json:"vanished,omitzero"`
	Duplicated Numbers `json:"duplicated,omitzero"`
	Reordered  Numbers `json:"reordered,omitzero"`
	Corrupt    Numbers `json:"corrupt,omitzero"`
	Error      string  `json:"error,omitempty"`
}

// Numbers counts messages and lists the first few of their numbers.
type Numbers struct {
	N     int64   `json:"n"`
	First []int64 `json:"first,omitempty"`
}

// ReadVerdict reads the verdict file at path.
func ReadVerdict(path string) (Verdict, error) {
	var v Verdict
	b, err := os.ReadFile(path)
	if err != nil {
		return v, err
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return v, fmt.Errorf("verdict %q: %w", b, err)
	}
	return v, nil
}

// CheckOK fails t unless the verdict at path says that all n messages
// were sent and came back, and was written within the last minute.
func CheckOK(t *testing.T, path string, n int64) {
	t.Helper()
	got, err := ReadVerdict(path)
	if err != nil {
		t.Fatal(err)
	}
	if !got.OK || got.Error != "" || got.Sent != n || got.Delivered != n || time.Since(got.At) > time.Minute || time.Since(got.At) < 0 {
		t.Fatalf("verdict %+v, want %d messages sent and delivered", got, n)
	}
}

// CheckFailed fails t unless the verdict at path says the client failed
// before it sent anything, with an error containing why ("" for any).
func CheckFailed(t *testing.T, path, why string) {
	t.Helper()
	got, err := ReadVerdict(path)
	if err != nil || got.OK || got.Error == "" || !strings.Contains(got.Error, why) || got.Sent != 0 {
		t.Fatalf("verdict of a failed client %+v: %v; want an error containing %q", got, err, why)
	}
}

// CheckShow fails t unless show (an example's `show READY`) prints the
// address the server listens on, ending in :port.
func CheckShow(t *testing.T, show *exec.Cmd, port int) {
	t.Helper()
	out, err := show.Output()
	var said struct{ Listening string }
	if err != nil || json.Unmarshal(out, &said) != nil || !strings.HasSuffix(said.Listening, fmt.Sprintf(":%d", port)) {
		t.Fatalf("%s: %q, %v", strings.Join(show.Args, " "), out, err)
	}
}

// Agents starts two agents (node-a and node-b, agenttest) for t: a
// server's allocation of 4 vconns on node-b and a client's of 2 on
// node-a, whose sockets it returns.
func Agents(ctx context.Context, t *testing.T) (cl *agenttest.Cluster, srvSock, cliSock string) {
	t.Helper()
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close() })
	if srvSock, err = cl.Nodes[1].Allocate(ctx, "server", 4); err != nil {
		t.Fatal(err)
	}
	if cliSock, err = cl.Nodes[0].Allocate(ctx, "client", 2); err != nil {
		t.Fatal(err)
	}
	return cl, srvSock, cliSock
}
