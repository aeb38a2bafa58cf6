package clib_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestCAgainstAgents runs test/test_vconn.c against node-a and node-b, on
// the socket and on shared memory.
func TestCAgainstAgents(t *testing.T) {
	runOnAgents(t, "test_vconn", "c", 16, 7000, goRoundTrips)
}

// runOnAgents runs the C test prog against two agents, node-a and node-b
// (allocations prefix-a of 4 vconns and prefix-b of quotaB), on the
// socket and on shared memory (VCONN_SHM), with its vconns on port; it
// must end by printing ok. then, if not nil, runs after it on the same
// agents.
func runOnAgents(t *testing.T, prog, prefix string, quotaB, port int,
	then func(t *testing.T, cl *agenttest.Cluster, sockA, sockB string, shared bool)) {
	for _, mode := range []string{"socket", "shm"} {
		t.Run(mode, func(t *testing.T) {
			cl := cluster(t)
			a := allocate(t, cl.Nodes[0], prefix+"-a", 4)
			b := allocate(t, cl.Nodes[1], prefix+"-b", quotaB)
			shmOn := "0"
			if mode == "shm" {
				shmOn = "1"
			}
			out := runC(t, prog, "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name,
				"VCONN_PORT="+strconv.Itoa(port), "VCONN_SHM="+shmOn)
			if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
				t.Fatalf("%s did not finish", prog)
			}
			if then != nil {
				then(t, cl, a, b, mode == "shm")
			}
		})
	}
}

// goRoundTrips measures what test_vconn.c prints, round trips of 32-byte
// messages, with the Go SDK on the same agents: the figure to set beside
// libvconn's (a measurement, not an assertion).
func goRoundTrips(t *testing.T, cl *agenttest.Cluster, sockA, sockB string, shared bool) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ga, err := vconn.NewClient(ctx, vconn.Options{Socket: sockA, SharedMemory: shared})
	if err != nil {
		t.Fatal(err)
	}
	defer ga.Close()
	gb, err := vconn.NewClient(ctx, vconn.Options{Socket: sockB, SharedMemory: shared})
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	ln, err := gb.Listen(ctx, ":7100")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.AcceptVConn()
		if err != nil {
			return
		}
		defer c.Close()
		for {
			m, err := c.RecvMsg(ctx)
			if err != nil || c.SendMsg(ctx, m.Data) != nil {
				return
			}
		}
	}()
	c, err := ga.Dial(ctx, cl.Nodes[1].Name+":7100")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const rounds = 500
	msg := make([]byte, 32)
	start := time.Now()
	for i := 0; i < rounds; i++ {
		if err := c.SendMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := c.RecvMsg(ctx); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("Go SDK round trip: %d of 32 bytes, %.1f us each", rounds, float64(time.Since(start).Microseconds())/rounds)
}

// TestCThreads runs test/test_threads.c: concurrent vconns, dials and
// closes on one client, then node-a's agent stops under a blocked read
// (when the program prints "stop").
func TestCThreads(t *testing.T) {
	for _, mode := range []string{"socket", "shm"} {
		t.Run(mode, func(t *testing.T) {
			cl := cluster(t)
			a := allocate(t, cl.Nodes[0], "t-a", 8)
			b := allocate(t, cl.Nodes[1], "t-b", 16)
			shmOn := "0"
			if mode == "shm" {
				shmOn = "1"
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, filepath.Join(build(t), "bin", "test_threads"))
			cmd.Env = append(sanitizerEnv(), "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name,
				"VCONN_PORT=7003", "VCONN_SHM="+shmOn)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			stacks(t, cmd)
			stdout, _ := cmd.StdoutPipe()
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var out strings.Builder
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				out.WriteString(sc.Text() + "\n")
				if sc.Text() == "stop" {
					if err := cl.Nodes[0].Stop(); err != nil {
						t.Errorf("stop node-a: %v", err)
					}
				}
			}
			err := cmd.Wait()
			t.Logf("test_threads:\n%s%s", out.String(), stderr.String())
			if err != nil {
				t.Fatal(err)
			}
			if !strings.HasSuffix(strings.TrimSpace(out.String()), "ok") {
				t.Fatal("test_threads did not finish")
			}
		})
	}
}

// runOnTwoNodes runs the C test prog with a client on each of two agents
// (allocations id-a and id-b of k vconns; the second's node and a port
// for it to listen on), and returns its output.
func runOnTwoNodes(t *testing.T, prog, id string, k int, port string) string {
	t.Helper()
	cl := cluster(t)
	a := allocate(t, cl.Nodes[0], id+"-a", k)
	b := allocate(t, cl.Nodes[1], id+"-b", k)
	return runC(t, prog, "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name, "VCONN_PORT="+port)
}

// TestCLeader runs test/test_lead.c: a thread waiting for a reply reads
// the socket itself (its background reader reads next to none of a ping
// pong's frames), and the background reader reads the answers to sends
// nobody waits for.
func TestCLeader(t *testing.T) {
	out := runOnTwoNodes(t, "test_lead", "ld", 4, "7006")
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatalf("test_lead did not finish")
	}
}

// TestCBridge runs test/test_bridge.c: vconns the agent hands over as
// kernel sockets (FlagBridge), read and written, half-closed, shared with
// a forked child, outliving their client.
func TestCBridge(t *testing.T) {
	out := runOnTwoNodes(t, "test_bridge", "br", 8, "7004")
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatal("test_bridge did not finish")
	}
}

// TestCBadInput: a C client's malformed frames each get a clear error
// and close its connection only; the library's clients, and a Go client
// of the same allocation, work afterwards.
func TestCBadInput(t *testing.T) {
	cl := cluster(t)
	a := allocate(t, cl.Nodes[0], "bad-a", 4)
	b := allocate(t, cl.Nodes[1], "bad-b", 4)
	out := runC(t, "test_badinput", "VCONN_SOCK_A="+a, "VCONN_SOCK_B="+b, "VCONN_NODE_B="+cl.Nodes[1].Name, "VCONN_PORT=7001")
	for _, want := range []string{"short datagram: error 1", "version 2: error 1", "unknown op: error 1", "unknown flag: error 1",
		"length mismatch: error 1", "grant on handle 0: error 1", "dial with req 0: error 1",
		"dial before hello: error 1", "a reply sent as a request: error 1"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in the output", want)
		}
	}
	// And a Go client of the same allocation.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ga, err := vconn.NewClient(ctx, vconn.Options{Socket: a})
	if err != nil {
		t.Fatal(err)
	}
	defer ga.Close()
	gb, err := vconn.NewClient(ctx, vconn.Options{Socket: b})
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	ln, err := gb.Listen(ctx, ":7002")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go agenttest.ServeEcho(ln)
	c, err := ga.Dial(ctx, cl.Nodes[1].Name+":7002")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := io.ReadFull(c, got); err != nil || string(got) != "ping" {
		t.Fatalf("echo after the bad clients: %q, %v", got, err)
	}
}

// TestCProtocol runs test/test_protocol.c: the rules issue 35 clarified,
// as libvconn meets them (bad arguments with their own codes, the client
// kept; bridging refused on ud before any listener hears of it).
func TestCProtocol(t *testing.T) {
	cl := cluster(t)
	ud, err := agenttest.Start(agenttest.Options{Transport: config.TransportUD})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ud.Close(); err != nil {
			t.Errorf("close the ud cluster: %v", err)
		}
	})
	out := runC(t, "test_protocol", "VCONN_SOCK_A="+allocate(t, cl.Nodes[0], "p-a", 4), "VCONN_SOCK_B="+allocate(t, cl.Nodes[1], "p-b", 4),
		"VCONN_UD_SOCK_A="+allocate(t, ud.Nodes[0], "u-a", 4), "VCONN_UD_SOCK_B="+allocate(t, ud.Nodes[1], "u-b", 4),
		"VCONN_NODE_B="+cl.Nodes[1].Name, "VCONN_PORT=7005")
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatal("test_protocol did not finish")
	}
}
