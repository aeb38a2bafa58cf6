package agent_test

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/engine"
)

// gather collects c into a pedantic registry (which checks that what is
// collected matches what is described) and returns each sample by
// name{label="value",...}, labels sorted.
func gather(t *testing.T, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out[sampleKey(mf.GetName(), m)] = sampleValue(m)
		}
	}
	return out
}

func sampleKey(name string, m *dto.Metric) string {
	var ls []string
	for _, l := range m.GetLabel() {
		ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(ls)
	if len(ls) == 0 {
		return name
	}
	return name + "{" + strings.Join(ls, ",") + "}"
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	}
	return 0
}

// TestMetrics: after an application on node-a sent known messages to one
// on node-b, the agents' collectors report them, the vconn and its QPs,
// the allocations and the quota in use, by the names the dashboard uses.
func TestMetrics(t *testing.T) {
	cl := startCluster(t, agenttest.Options{Transport: config.TransportAuto, VConnsPerNode: 50})
	na, nb := cl.Nodes[0], cl.Nodes[1]
	a := appClient(t, na, "a", 3)
	b := appClient(t, nb, "b", 5)
	ctx := ctxT(t)
	ln, err := b.Listen(ctx, ":9")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan error, 1)
	const msgs, size = 20, 300
	go func() {
		// Left open: node-b counts it in use. The client's cleanup
		// closes it.
		c, err := ln.AcceptVConn()
		if err != nil {
			accepted <- err
			return
		}
		for range msgs {
			m, err := c.RecvMsg(ctx)
			if err != nil {
				accepted <- err
				return
			}
			if len(m.Data) != size {
				accepted <- fmt.Errorf("received %d bytes, want %d", len(m.Data), size)
				return
			}
		}
		accepted <- nil
	}()
	c, err := a.Dial(ctx, "node-b:9")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range msgs {
		if err := c.SendMsg(ctx, make([]byte, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-accepted; err != nil {
		t.Fatal(err)
	}

	sa := gather(t, na.Agent.Collector())
	sb := gather(t, nb.Agent.Collector())
	t.Logf("node-a: %v", sa)
	exact := map[string]float64{
		`rdmavisor_vconns{state="open"}`:                  1,
		`rdmavisor_vconns{state="failed"}`:                0,
		`rdmavisor_peers`:                                 1,
		`rdmavisor_qps{peer="node-b",rail="0",type="rc"}`: 1,
		`rdmavisor_qps{peer="node-b",rail="0",type="uc"}`: 1,
		`rdmavisor_peer_vconns{peer="node-b",rail="0"}`:   1,
		`rdmavisor_messages_sent_total{transport="auto"}`: msgs,
		`rdmavisor_sent_bytes_total{transport="auto"}`:    msgs * size,
		`rdmavisor_messages_sent_total{transport="rc"}`:   0,
		`rdmavisor_allocations`:                           1,
		`rdmavisor_vconn_quota{kind="capacity"}`:          50,
		`rdmavisor_vconn_quota{kind="allocated"}`:         3,
		`rdmavisor_vconn_quota{kind="used"}`:              1,
		`rdmavisor_retransmissions_total{cause="gap"}`:    0,
	}
	// Honest traffic: nothing refused, every reason exported.
	for r := range engine.NumRejectReasons {
		exact[`rdmavisor_messages_dropped_total{reason="`+engine.RejectReason(r).String()+`"}`] = 0
	}
	for k, want := range exact {
		if got, ok := sa[k]; !ok || got != want {
			t.Errorf("node-a %s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	for k, want := range map[string]float64{
		`rdmavisor_messages_received_total{transport="auto"}`:  msgs,
		`rdmavisor_received_bytes_total{transport="auto"}`:     msgs * size,
		`rdmavisor_qps{peer="node-a",rail="0",type="ingress"}`: 2,
		`rdmavisor_vconn_quota{kind="used"}`:                   1, // the accepted vconn
	} {
		if got := sb[k]; got != want {
			t.Errorf("node-b %s = %v, want %v", k, got, want)
		}
	}
	if sa[`rdmavisor_doorbells_total`] == 0 || sa[`rdmavisor_work_requests_posted_total`] < sa[`rdmavisor_doorbells_total`] {
		t.Errorf("doorbells %v, work requests %v: want some, at least one each", sa[`rdmavisor_doorbells_total`], sa[`rdmavisor_work_requests_posted_total`])
	}
	if sa[`rdmavisor_poller_busy_seconds_total{poller="0"}`] <= 0 {
		t.Error("poller 0 of node-a, which sent every message, reports no busy time")
	}
	if problems, err := testutil.CollectAndLint(na.Agent.Collector()); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %+v", err, problems)
	}
}

// TestMetricsEndpoint: the agent serves its metrics, with the Go runtime's,
// on the metrics address next to /healthz.
func TestMetricsEndpoint(t *testing.T) {
	a, ml := standaloneAgent(t, "node-m", "127.0.0.5")
	defer a.Close()
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get("http://" + ml.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	for _, want := range []string{
		`rdmavisor_vconns{state="open"} 0`,
		`rdmavisor_messages_sent_total{transport="rc"} 0`,
		`rdmavisor_poller_busy_seconds_total{poller="0"}`,
		`rdmavisor_vconn_quota{kind="capacity"} `,
		`go_goroutines `,
	} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
