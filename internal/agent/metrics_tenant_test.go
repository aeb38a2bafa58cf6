package agent_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// waitSamples gathers c until every sample of want has its value (the
// delivery loop counts a message once the pod's socket took it, which
// may be after the pod read it), at most 10 s, and returns the last
// gathering; a sample still different is an error.
func waitSamples(t *testing.T, who string, c prometheus.Collector, want map[string]float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := gather(t, c)
		var diffs []string
		for k, v := range want {
			if g, ok := got[k]; !ok || g != v {
				diffs = append(diffs, fmt.Sprintf("%s %s = %v (present %v), want %v", who, k, g, ok, v))
			}
		}
		if len(diffs) == 0 {
			return got
		}
		if time.Now().After(deadline) {
			for _, d := range diffs {
				t.Error(d)
			}
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// podSamples are the per-pod series of ns/pod that want holds, with the
// refusals and drops not named in it zero.
func podSamples(ns, pod string, vals map[string]float64) map[string]float64 {
	out := make(map[string]float64)
	l := fmt.Sprintf("namespace=%q,pod=%q", ns, pod)
	for _, d := range []string{"sent", "received"} {
		out[fmt.Sprintf(`rdmavisor_pod_messages_dropped_total{direction=%q,%s}`, d, l)] = 0
	}
	for _, r := range []string{"quota", "limit", "refused", "address_in_use"} {
		out[fmt.Sprintf(`rdmavisor_pod_refusals_total{%s,reason=%q}`, l, r)] = 0
	}
	for k, v := range vals {
		name, extra, _ := strings.Cut(k, "|")
		switch {
		case extra != "" && strings.HasPrefix(extra, "direction="):
			out[fmt.Sprintf(`%s{%s,%s}`, name, extra, l)] = v
		case extra != "":
			out[fmt.Sprintf(`%s{%s,%s}`, name, l, extra)] = v
		default:
			out[fmt.Sprintf(`%s{%s}`, name, l)] = v
		}
	}
	return out
}

// TestPodMetrics: a pod on node-a dials a pod on node-b, and each sends
// the other known messages; each agent reports them under its pod, with
// the vconn open, the quota and the refusals each pod was answered. Two
// allocations of one pod are summed, an unbound pod allocation shows
// no id, a host-service allocation shows its id, and a pod's series go
// with its allocations.
func TestPodMetrics(t *testing.T) {
	cl := startCluster(t, agenttest.Options{VConnsPerNode: 50, TuneConfig: func(c *config.AgentConfig) {
		c.Limits.Listeners = 2
	}})
	na, nb := cl.Nodes[0], cl.Nodes[1]
	ctx := ctxT(t)
	server := podClient(t, ctx, nb, "shop", "server", "10.244.1.20", 4)
	client := podClient(t, ctx, na, "shop", "client", "10.244.0.20", 1)
	ln := refuseOnce(t, ctx, client, server)
	const msgs, up, down = 20, 300, 100
	c := exchange(t, ctx, client, ln, msgs, up, down)
	defer c.Close()
	if _, err := client.Dial(ctx, "10.244.1.20:9"); !errors.Is(err, vconn.ErrQuota) {
		t.Fatalf("a second dial on a quota of 1: %v, want ErrQuota", err)
	}

	waitSamples(t, "node-a", na.Agent.Collector(), podSamples("shop", "client", map[string]float64{
		"rdmavisor_pod_vconns_open": 1, "rdmavisor_pod_vconn_quota": 1,
		"rdmavisor_pod_messages_sent_total": msgs, "rdmavisor_pod_sent_bytes_total": msgs * up,
		"rdmavisor_pod_messages_received_total": msgs, "rdmavisor_pod_received_bytes_total": msgs * down,
		`rdmavisor_pod_refusals_total|reason="quota"`: 1, `rdmavisor_pod_refusals_total|reason="refused"`: 1,
	}))
	waitSamples(t, "node-b", nb.Agent.Collector(), podSamples("shop", "server", map[string]float64{
		"rdmavisor_pod_vconns_open": 1, "rdmavisor_pod_vconn_quota": 4,
		"rdmavisor_pod_messages_sent_total": msgs, "rdmavisor_pod_sent_bytes_total": msgs * down,
		"rdmavisor_pod_messages_received_total": msgs, "rdmavisor_pod_received_bytes_total": msgs * up,
		`rdmavisor_pod_refusals_total|reason="address_in_use"`: 1, `rdmavisor_pod_refusals_total|reason="limit"`: 1,
	}))
	checkPodLabels(t, na)
	if problems, err := testutil.CollectAndLint(na.Agent.Collector()); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}

	// Deleted, the client's allocations take its series with them; the
	// server's stay.
	for _, id := range []string{"alloc-client", "alloc-client-2"} {
		if err := na.Agent.DeleteAllocation(id); err != nil {
			t.Fatal(err)
		}
	}
	for k := range gather(t, na.Agent.Collector()) {
		if strings.Contains(k, `pod="client"`) {
			t.Errorf("node-a after the client's allocations went: %s", k)
		}
	}
	if got := gather(t, nb.Agent.Collector())[`rdmavisor_pod_messages_received_total{namespace="shop",pod="server"}`]; got != msgs {
		t.Errorf("node-b's server after node-a's client went: %v messages received, want %d", got, msgs)
	}
}

// refuseOnce has the server pod (limits.listeners 2) listen on :9 and :10
// and be refused once for the address in use and once for the limit, and
// the client dial a port nothing listens on; it returns :9's listener.
func refuseOnce(t *testing.T, ctx context.Context, client, server *vconn.Client) *vconn.Listener {
	t.Helper()
	ln, err := server.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	if _, err := server.Listen(ctx, ":9"); !errors.Is(err, vconn.ErrAddrInUse) {
		t.Fatalf("listen on :9 again: %v, want ErrAddrInUse", err)
	}
	ln2, err := server.Listen(ctx, ":10")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln2.Close() })
	if _, err := server.Listen(ctx, ":11"); !errors.Is(err, vconn.ErrLimit) {
		t.Fatalf("a third listener past limits.listeners 2: %v, want ErrLimit", err)
	}
	if _, err := client.Dial(ctx, "10.244.1.20:12"); !errors.Is(err, vconn.ErrRefused) {
		t.Fatalf("dial a port nothing listens on: %v, want ErrRefused", err)
	}
	return ln
}

// exchange dials ln from client and sends msgs messages of up bytes, each
// answered by one of down bytes; the accepted vconn stays open.
func exchange(t *testing.T, ctx context.Context, client *vconn.Client, ln *vconn.Listener, msgs, up, down int) *vconn.Conn {
	t.Helper()
	served := make(chan error, 1)
	go func() {
		c, err := ln.AcceptVConn()
		if err != nil {
			served <- err
			return
		}
		for range msgs {
			if _, err := c.RecvMsg(ctx); err != nil {
				served <- err
				return
			}
			if err := c.SendMsg(ctx, make([]byte, down)); err != nil {
				served <- err
				return
			}
		}
		served <- nil // left open: the server's node counts it
	}()
	c, err := client.Dial(ctx, ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for range msgs {
		if err := c.SendMsg(ctx, make([]byte, up)); err != nil {
			t.Fatal(err)
		}
		if m, err := c.RecvMsg(ctx); err != nil || len(m.Data) != down {
			t.Fatalf("reply: %d bytes, %v; want %d", len(m.Data), err, down)
		}
	}
	if err := <-served; err != nil {
		t.Fatal(err)
	}
	return c
}

// checkPodLabels: on n, a second allocation of the client pod is summed
// with its first, a pod allocation not yet bound is labelled with neither
// pod nor id, and a host service's allocation with its id.
func checkPodLabels(t *testing.T, n *agenttest.Node) {
	t.Helper()
	const secret = "dp-0123456789abcdef"
	if _, err := n.Agent.CreatePodAllocation("alloc-client-2", 2); err != nil {
		t.Fatal(err)
	}
	if err := n.Agent.BindAllocation("alloc-client-2", "shop", "client"); err != nil {
		t.Fatal(err)
	}
	for id, k := range map[string]int{secret: 5, "host-svc": 3} {
		create := n.Agent.CreatePodAllocation
		if id == "host-svc" {
			create = n.Agent.CreateAllocation
		}
		if _, err := create(id, k); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Agent.DeleteAllocation(id) })
	}
	got := gather(t, n.Agent.Collector())
	for k, want := range map[string]float64{
		`rdmavisor_pod_vconn_quota{namespace="shop",pod="client"}`: 3,
		`rdmavisor_pod_vconns_open{namespace="shop",pod="client"}`: 1,
		`rdmavisor_pod_vconn_quota{namespace="",pod=""}`:           5,
		`rdmavisor_pod_vconn_quota{namespace="",pod="host-svc"}`:   3,
	} {
		if g, ok := got[k]; !ok || g != want {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, want)
		}
	}
	for k := range got {
		if strings.Contains(k, secret) {
			t.Errorf("a series names the unbound allocation's id: %s", k)
		}
	}
}
