package agent_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
)

type podEvents struct {
	mu     sync.Mutex
	got    []admin.Pod
	als    []admin.Allocation
	failed []failedTell
}

type failedTell struct {
	pod admin.Pod
	n   int
	why string
}

func (e *podEvents) VConnsFailed(p admin.Pod, n int, why string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.failed = append(e.failed, failedTell{p, n, why})
}

func (e *podEvents) Allocated(p admin.Pod, al admin.Allocation) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got, e.als = append(e.got, p), append(e.als, al)
}

// Binding an allocation to a pod tells PodEvents once, with the pod's UID
// as the CNI plugin registered it (kubectl describe finds Events by it),
// whichever of the two came first; binding or registering again says
// nothing more.
func TestBindAllocationTellsPodEvents(t *testing.T) {
	ev := &podEvents{}
	c, err := agenttest.Start(agenttest.Options{Log: logr.Discard(), TuneAgent: func(o *agent.Options) { o.PodEvents = ev }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a := c.Nodes[0].Agent
	if err := a.RegisterPod(admin.Pod{UID: "uid-7", Namespace: "team", Name: "echo", IPs: []string{"10.244.0.7"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := a.CreatePodAllocation("dp-7", 8); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := a.BindAllocation("dp-7", "team", "echo"); err != nil {
			t.Fatal(err)
		}
	}
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.got) != 1 || ev.got[0].UID != "uid-7" || ev.got[0].Namespace != "team" || ev.got[0].Name != "echo" {
		t.Fatalf("PodEvents told %+v, want once the pod team/echo with uid uid-7", ev.got)
	}
	if ev.als[0].ID != "dp-7" || ev.als[0].VConns != 8 || ev.als[0].Pod != "team/echo" {
		t.Errorf("allocation told %+v, want dp-7 of 8 vconns bound to team/echo", ev.als[0])
	}
	ev.mu.Unlock()

	// The kubelet often binds before the pod's network is up: the pod is
	// told once the CNI plugin registered it, with its UID.
	if _, err := a.CreatePodAllocation("dp-8", 4); err != nil {
		t.Fatal(err)
	}
	if err := a.BindAllocation("dp-8", "team", "late"); err != nil {
		t.Fatal(err)
	}
	ev.mu.Lock()
	if len(ev.got) != 1 {
		t.Fatalf("PodEvents told %+v before the pod was registered; want nothing yet (no UID)", ev.got[1:])
	}
	ev.mu.Unlock()
	for range 2 {
		if err := a.RegisterPod(admin.Pod{UID: "uid-8", Namespace: "team", Name: "late", IPs: []string{"10.244.0.8"}}); err != nil {
			t.Fatal(err)
		}
	}
	ev.mu.Lock()
	if len(ev.got) != 2 || ev.got[1].UID != "uid-8" || ev.als[1].ID != "dp-8" {
		t.Fatalf("PodEvents told %+v (%+v), want once more: team/late, uid-8, dp-8", ev.got, ev.als)
	}
}

// TestLostPeerTellsPodEvents: a pod's three vconns to node-b fail when
// node-b's agent stops answering; the pod is told once, in one Event,
// how many failed and why (naming the node). The server's pod on node-b
// is told nothing: its agent is the one that went.
func TestLostPeerTellsPodEvents(t *testing.T) {
	ev := &podEvents{}
	cl := startCluster(t, agenttest.Options{HeartbeatTimeout: time.Second, TuneAgent: func(o *agent.Options) { o.PodEvents = ev }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nodeA, nodeB := cl.Nodes[0], cl.Nodes[1]
	srv := podClient(t, ctx, nodeB, "team", "srv", "10.244.1.5", 8)
	cli := podClient(t, ctx, nodeA, "team", "cli", "10.244.0.5", 8)
	ln, err := srv.Listen(ctx, ":7000")
	if err != nil {
		t.Fatal(err)
	}
	go agenttest.ServeEcho(ln)
	for range 3 {
		c, err := cli.Dial(ctx, "10.244.1.5:7000")
		if err != nil {
			t.Fatal(err)
		}
		echoes(t, c, "up")
		defer c.Close()
	}
	if err := nodeB.Stop(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		ev.mu.Lock()
		got := append([]failedTell(nil), ev.failed...)
		ev.mu.Unlock()
		if len(got) > 0 {
			time.Sleep(2 * agent.FailedTellDelay) // a second Event would come by now
			ev.mu.Lock()
			got = append([]failedTell(nil), ev.failed...)
			ev.mu.Unlock()
			if len(got) != 1 || got[0].pod.UID != "uid-cli" || got[0].n != 3 || !strings.Contains(got[0].why, "node-b") {
				t.Fatalf("PodEvents told %+v; want once: uid-cli, 3 vconns, naming node-b", got)
			}
			t.Logf("told: %d vconns failed: %s", got[0].n, got[0].why)
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the client pod was not told its vconns failed")
		}
		time.Sleep(50 * time.Millisecond)
	}
}
