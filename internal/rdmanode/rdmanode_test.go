package rdmanode

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/discovery"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

var k8s client.WithWatch

func TestMain(m *testing.M) {
	env, cfg, err := testenv.Start()
	if err == nil {
		k8s, err = client.NewWithWatch(cfg, client.Options{Scheme: testenv.Scheme()})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

// fakeAgent is a Source whose state the test sets.
type fakeAgent struct{ st chan admin.Status }

func (f *fakeAgent) Status() admin.Status {
	s := <-f.st
	f.st <- s
	return s
}

func (f *fakeAgent) set(s admin.Status) { <-f.st; f.st <- s }

func newFake(s admin.Status) *fakeAgent {
	f := &fakeAgent{st: make(chan admin.Status, 1)}
	f.st <- s
	return f
}

func get(t *testing.T, name string) *v1alpha1.RDMANode {
	var rn v1alpha1.RDMANode
	if err := k8s.Get(context.Background(), client.ObjectKey{Name: name}, &rn); err != nil {
		if apierrors.IsNotFound(err) {
			return nil
		}
		t.Fatal(err)
	}
	return &rn
}

// TestReporterAndDiscovery: two agents' reporters write their RDMANodes;
// each one's discovery finds the other (never itself, never another
// service's node), loses it when it stops, and finds it again.
func TestReporterAndDiscovery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := testr.New(t)
	a := newFake(admin.Status{Ready: true, Node: "node-a", Capacity: 64, VConns: 3, QPs: 4, Device: "soft-10.0.0.1", GID: "10.0.0.1", Control: "10.0.0.1:7471"})
	b := newFake(admin.Status{Ready: true, Node: "node-b", Capacity: 64, Device: "soft-10.0.0.2", GID: "10.0.0.2", Control: "10.0.0.2:7471"})
	other := newFake(admin.Status{Ready: true, Node: "node-c", Capacity: 8, Device: "soft-10.0.0.3", GID: "10.0.0.3", Control: "10.0.0.3:7471"})

	run := func(ctx context.Context, node, svc string, src Source) chan struct{} {
		r := &Reporter{Client: k8s, Node: node, Service: svc, Provider: v1alpha1.ProviderSoft, Log: log, Poll: 20 * time.Millisecond}
		done := make(chan struct{})
		go func() { defer close(done); r.Run(ctx, src) }()
		return done
	}
	ctxB, stopB := context.WithCancel(ctx)
	run(ctx, "node-a", "svc", a)
	doneB := run(ctxB, "node-b", "svc", b)
	run(ctx, "node-c", "other", other)

	poll.Until(t, 20*time.Second, "node-a's RDMANode", func() bool {
		rn := get(t, "node-a")
		return rn != nil && meta.IsStatusConditionTrue(rn.Status.Conditions, v1alpha1.ConditionNodeReady)
	})
	rn := get(t, "node-a")
	if rn.Spec.ServiceName != "svc" || rn.Status.VConnCapacity != 64 || rn.Status.VConnsOpen != 3 || rn.Status.QPsInUse != 4 ||
		rn.Status.Address == nil || rn.Status.Address.IP != "10.0.0.1" || rn.Status.Address.ControlPort != 7471 ||
		len(rn.Status.Devices) != 1 || rn.Status.Devices[0].GID != "10.0.0.1" || rn.Status.Devices[0].Health != v1alpha1.DeviceHealthy ||
		rn.Status.HeartbeatTime == nil {
		t.Fatalf("node-a's RDMANode: %+v", rn)
	}
	// A change is reported within a poll, not a heartbeat.
	a.set(admin.Status{Ready: true, Node: "node-a", Capacity: 64, VConns: 9, QPs: 6, Device: "soft-10.0.0.1", GID: "10.0.0.1", Control: "10.0.0.1:7471"})
	poll.Until(t, 20*time.Second, "node-a's new load", func() bool { rn := get(t, "node-a"); return rn.Status.VConnsOpen == 9 && rn.Status.QPsInUse == 6 })

	changes := make(chan []discovery.Peer, 16)
	d := &Discovery{Client: k8s, Service: "svc", Self: "node-a", Log: log}
	go d.Watch(ctx, func(p []discovery.Peer) { changes <- p })
	want := []discovery.Peer{{NodeName: "node-b", Address: "10.0.0.2:7471"}}
	waitPeers := func(want []discovery.Peer) {
		t.Helper()
		for {
			select {
			case p := <-changes:
				if slices.EqualFunc(p, want, discovery.Peer.Equal) {
					if !slices.EqualFunc(d.Peers(), want, discovery.Peer.Equal) {
						t.Fatalf("Peers() = %v, want %v", d.Peers(), want)
					}
					return
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("peers never became %v (now %v)", want, d.Peers())
			}
		}
	}
	waitPeers(want)

	// node-b's agent stops: it marks itself not ready, and is no peer.
	stopB()
	<-doneB
	rnB := get(t, "node-b")
	if c := meta.FindStatusCondition(rnB.Status.Conditions, v1alpha1.ConditionNodeReady); c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonStopped {
		t.Fatalf("stopped node-b: %+v", rnB.Status.Conditions)
	}
	waitPeers(nil)
	// It comes back.
	run(ctx, "node-b", "svc", b)
	waitPeers(want)
	cancel()
}

// TestReporterRefusesAnotherServicesNode: an RDMANode written by another
// service's agent is left alone, with a clear error.
func TestReporterRefusesAnotherServicesNode(t *testing.T) {
	ctx := context.Background()
	rn := &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: "node-x"}, Spec: v1alpha1.RDMANodeSpec{ServiceName: "first"}}
	if err := k8s.Create(ctx, rn); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), rn) })
	r := &Reporter{Client: k8s, Node: "node-x", Service: "second", Provider: v1alpha1.ProviderSoft}
	err := r.Write(ctx, r.status(admin.Status{Ready: true, Capacity: 1}, nil, metav1.Now()))
	if err == nil || get(t, "node-x").Spec.ServiceName != "first" {
		t.Fatalf("write over another service's RDMANode: %v", err)
	}
	t.Log(err)
}

// TestStoppingReporterDoesNotRecreate: the last, not-ready write of a
// stopping agent does not bring back an RDMANode the operator deleted.
func TestStoppingReporterDoesNotRecreate(t *testing.T) {
	r := &Reporter{Client: k8s, Node: "node-gone", Service: "svc", Provider: v1alpha1.ProviderSoft, Log: testr.New(t)}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stopped before its first write: only the final one runs
	r.Run(ctx, newFake(admin.Status{Ready: true, Capacity: 1, Control: "10.0.0.9:7471"}))
	if rn := get(t, "node-gone"); rn != nil {
		t.Fatalf("a stopping agent created %+v", rn)
	}
}

// TestReportUnreachablePeers: the peers the agent says stopped answering
// are listed and named in PeersReachable; with none it is True.
func TestReportUnreachablePeers(t *testing.T) {
	r := &Reporter{Node: "n1", Provider: v1alpha1.ProviderSoft}
	st := r.status(admin.Status{Ready: true, Capacity: 1, Unreachable: []string{"n2", "n3"}}, nil, metav1.Now())
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPeersReachable)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != ReasonPeerUnreachable || c.Message != "no answer from the agents of n2, n3" {
		t.Errorf("PeersReachable %+v", c)
	}
	if !slices.Equal(st.UnreachablePeers, []string{"n2", "n3"}) {
		t.Errorf("UnreachablePeers %v", st.UnreachablePeers)
	}
	st = r.status(admin.Status{Ready: true, Capacity: 1}, nil, metav1.Now())
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionPeersReachable); c == nil || c.Status != metav1.ConditionTrue || len(st.UnreachablePeers) != 0 {
		t.Errorf("with every peer answering: PeersReachable %+v, UnreachablePeers %v", c, st.UnreachablePeers)
	}
}
