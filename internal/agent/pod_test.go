package agent_test

import (
	"errors"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// TestUnregisterPodClosesItsVConns: the CNI plugin's DEL of a pod closes
// the connections its applications made from the pod's network namespace,
// and with them the pod's vconns; the peer sees them end. (The test's
// "pod" is this process's own namespace.)
func TestUnregisterPodClosesItsVConns(t *testing.T) {
	cl := startCluster(t, agenttest.Options{})
	a := appClient(t, cl.Nodes[0], "a", 4)
	b := appClient(t, cl.Nodes[1], "b", 4)
	ctx := ctxT(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan *vconn.Conn, 1)
	go func() {
		c, err := ln.AcceptVConn()
		if err == nil {
			accepted <- c
		}
	}()
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	peer := <-accepted
	ac, err := admin.Dial(ctx, cl.Nodes[0].Config.AdminSocket)
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	pod := admin.Pod{UID: "0b8c2d1e-pod", Namespace: "default", Name: "client", Netns: "/proc/self/ns/net"}
	if err := ac.RegisterPod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	if err := ac.UnregisterPod(ctx, pod.UID); err != nil {
		t.Fatal(err)
	}
	// The pod's vconn is gone: its own side fails, the peer reads its end.
	for _, side := range []struct {
		name string
		c    *vconn.Conn
	}{{"the pod's", c}, {"the peer's", peer}} {
		done := make(chan error, 1)
		go func() {
			_, err := side.c.RecvMsg(ctx)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				t.Fatalf("%s vconn received a message after the pod was unregistered", side.name)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s vconn did not end after the pod was unregistered", side.name)
		}
	}
	// Unregistering again, or an unknown pod, is not an error.
	if err := ac.UnregisterPod(ctx, pod.UID); err != nil && !errors.Is(err, admin.ErrNotFound) {
		t.Fatal(err)
	}
}
