package agent

import (
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// collector exports the agent's state as Prometheus metrics, the node's
// and each pod's (metrics_tenant.go). It reads the engine's and the
// allocations' snapshots when scraped: the data plane only keeps its
// plain counters, and nothing is done per message for Prometheus.
type collector struct {
	a *Agent
}

// Metric descriptions. The names are the contract with the chart's
// dashboard (charts/rdmavisor/dashboards), which a test checks.
var (
	descVConns = prometheus.NewDesc("rdmavisor_vconns",
		"Vconns of this node's engines (every rail), by state.", []string{"state"}, nil)
	descPeers = prometheus.NewDesc("rdmavisor_peers",
		"Peer nodes the engine holds shared QPs for.", nil, nil)
	descQPs = prometheus.NewDesc("rdmavisor_qps",
		"Shared QPs toward a peer, by type: rc and uc are those this engine created, ingress those the peer created toward it.",
		[]string{"peer", "type", "rail"}, nil)
	descPeerVConns = prometheus.NewDesc("rdmavisor_peer_vconns",
		"Open vconns to a peer, multiplexed over its shared QPs, by rail.", []string{"peer", "rail"}, nil)
	descMsgsSent = prometheus.NewDesc("rdmavisor_messages_sent_total",
		"Application messages handed to the device, by transport (retransmissions excluded).", []string{"transport"}, nil)
	descBytesSent = prometheus.NewDesc("rdmavisor_sent_bytes_total",
		"Payload bytes of the messages sent, by transport.", []string{"transport"}, nil)
	descMsgsRecv = prometheus.NewDesc("rdmavisor_messages_received_total",
		"Application messages delivered to vconns, by transport.", []string{"transport"}, nil)
	descBytesRecv = prometheus.NewDesc("rdmavisor_received_bytes_total",
		"Payload bytes of the messages received, by transport.", []string{"transport"}, nil)
	descRetransmits = prometheus.NewDesc("rdmavisor_retransmissions_total",
		"Auto datagrams sent again for want of an acknowledgement, by cause: timeout, or gap (the peer reported a loss).",
		[]string{"cause"}, nil)
	descCreditStalls = prometheus.NewDesc("rdmavisor_credit_stalls_total",
		"Times a vconn had a message to send and no receive credit from its peer.", nil, nil)
	descDoorbells = prometheus.NewDesc("rdmavisor_doorbells_total",
		"PostSend calls; work_requests_posted over doorbells is the batch size.", nil, nil)
	descWRs = prometheus.NewDesc("rdmavisor_work_requests_posted_total",
		"Send work requests posted.", nil, nil)
	descDropped = prometheus.NewDesc("rdmavisor_messages_dropped_total",
		"Messages dropped on receipt, by reason: stale (for a closed vconn), malformed, or refused for a live vconn: "+
			"peer (from a node other than the vconn's peer), transport (control or RC data as a datagram), "+
			"credit (past the receive credits granted; the vconn fails), grant (a credit grant past what the peer could grant; cut), "+
			"overflow (a UC or UD datagram for a full receive queue).", []string{"reason"}, nil)
	descBuffers = prometheus.NewDesc("rdmavisor_buffers_in_use",
		"Registered buffers in use, by pool class.", []string{"class"}, nil)
	descPollerBusy = prometheus.NewDesc("rdmavisor_poller_busy_seconds_total",
		"Time a poller spent in rounds that found work; its rate is the poller's busy ratio.", []string{"poller"}, nil)
	descPollerSleeps = prometheus.NewDesc("rdmavisor_poller_sleeps_total",
		"Times a poller, idle, blocked on its completion channel.", nil, nil)
	descAllocations = prometheus.NewDesc("rdmavisor_allocations",
		"Allocations (pods' shares of the node's vconns).", nil, nil)
	descQuota = prometheus.NewDesc("rdmavisor_vconn_quota",
		"The node's vconns: capacity (vconnsPerNode), allocated to pods, and in use by them.", []string{"kind"}, nil)
	descRailUp = prometheus.NewDesc("rdmavisor_rail_up",
		"1 while the rail's device port is ACTIVE, 0 while it is down or the device is gone (no new allocation is bound to it).",
		[]string{"rail", "device"}, nil)
)

var allDescs = append([]*prometheus.Desc{descVConns, descPeers, descQPs, descPeerVConns, descMsgsSent, descBytesSent,
	descMsgsRecv, descBytesRecv, descRetransmits, descCreditStalls, descDoorbells, descWRs, descDropped,
	descBuffers, descPollerBusy, descPollerSleeps, descAllocations, descQuota, descRailUp}, tenantDescs...)

// Describe sends every metric's description.
func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range allDescs {
		ch <- d
	}
}

// Collect reads the snapshots.
func (c collector) Collect(ch chan<- prometheus.Metric) {
	a := c.a
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	// Every rail's engine: the node's figures are their sums, and a peer's
	// QPs and vconns are labelled with the rail they are on.
	var states engine.StateCounts
	var sent, recv [engine.NumTransports]engine.Traffic
	var rejects [engine.NumRejectReasons]uint64
	var st engine.Stats
	var buffers []int
	peers, poller := 0, 0
	names := a.peerNames()
	for rail, e := range a.engines {
		es := e.Stats()
		ps, sc := e.PeerStats()
		states.Connecting += sc.Connecting
		states.Open += sc.Open
		states.Closing += sc.Closing
		states.Failed += sc.Failed
		peers += len(ps)
		r := strconv.Itoa(rail)
		for _, p := range ps {
			name := names[p.GID]
			if name == "" {
				name = p.GID.String()
			}
			gauge(descQPs, float64(p.RCQPs), name, "rc", r)
			gauge(descQPs, float64(p.UCQPs), name, "uc", r)
			gauge(descQPs, float64(p.IngressQPs), name, "ingress", r)
			gauge(descPeerVConns, float64(p.VConns.Open), name, r)
		}
		s, rv := e.TrafficStats()
		for t := range sent {
			sent[t].Msgs, sent[t].Bytes = sent[t].Msgs+s[t].Msgs, sent[t].Bytes+s[t].Bytes
			recv[t].Msgs, recv[t].Bytes = recv[t].Msgs+rv[t].Msgs, recv[t].Bytes+rv[t].Bytes
		}
		for i, n := range e.RejectStats() {
			rejects[i] += n
		}
		st.Retransmits += es.Retransmits
		st.GapResends += es.GapResends
		st.CreditStalls += es.CreditStalls
		st.Posts += es.Posts
		st.WRsPosted += es.WRsPosted
		st.StaleDropped += es.StaleDropped
		st.Malformed += es.Malformed
		st.Sleeps += es.Sleeps
		for i, n := range es.BuffersInUse {
			if i == len(buffers) {
				buffers = append(buffers, 0)
			}
			buffers[i] += n
		}
		// Pollers are numbered across the rails, rail 0's first.
		for _, ps := range e.PollerStats() {
			ch <- prometheus.MustNewConstMetric(descPollerBusy, prometheus.CounterValue, ps.Busy.Seconds(), strconv.Itoa(poller))
			poller++
		}
	}
	for _, s := range []struct {
		name string
		n    int
	}{{"connecting", states.Connecting}, {"open", states.Open}, {"closing", states.Closing}, {"failed", states.Failed}} {
		gauge(descVConns, float64(s.n), s.name)
	}
	gauge(descPeers, float64(peers))
	for t := transport.RC; t <= transport.Auto; t++ { // no vconn's is Unknown
		tr := t.String()
		counter(descMsgsSent, sent[t].Msgs, tr)
		counter(descBytesSent, sent[t].Bytes, tr)
		counter(descMsgsRecv, recv[t].Msgs, tr)
		counter(descBytesRecv, recv[t].Bytes, tr)
	}
	counter(descRetransmits, st.Retransmits-st.GapResends, "timeout")
	counter(descRetransmits, st.GapResends, "gap")
	counter(descCreditStalls, st.CreditStalls)
	counter(descDoorbells, st.Posts)
	counter(descWRs, st.WRsPosted)
	counter(descDropped, st.StaleDropped, "stale")
	counter(descDropped, st.Malformed, "malformed")
	for r, n := range rejects {
		counter(descDropped, n, engine.RejectReason(r).String())
	}
	for i, n := range buffers {
		gauge(descBuffers, float64(n), strconv.Itoa(i))
	}
	counter(descPollerSleeps, st.Sleeps)
	allocs := a.Allocations()
	allocated, used := 0, 0
	for _, al := range allocs {
		allocated += al.VConns
		used += al.InUse
	}
	gauge(descAllocations, float64(len(allocs)))
	gauge(descQuota, float64(a.cfg.VConnsPerNode), "capacity")
	gauge(descQuota, float64(allocated), "allocated")
	gauge(descQuota, float64(used), "used")
	for i, why := range a.railsDown() {
		up := 0.0
		if why == "" {
			up = 1
		}
		gauge(descRailUp, up, strconv.Itoa(i), a.devs[i].Attr().Name)
	}
	c.collectTenants(ch)
}

// peerNames maps the GIDs of the peer agents this one talks to to their
// node names, for labels people read.
func (a *Agent) peerNames() map[verbs.GID]string {
	a.mu.Lock()
	rs := make([]*remote, 0, len(a.remotes))
	for _, r := range a.remotes {
		rs = append(rs, r)
	}
	a.mu.Unlock()
	names := make(map[verbs.GID]string, len(rs))
	for _, r := range rs {
		r.mu.Lock()
		for _, p := range r.peersLocked() {
			if p != nil && r.node != "" {
				names[p.GID()] = r.node
			}
		}
		r.mu.Unlock()
	}
	return names
}

// Collector returns a Prometheus collector of the agent's metrics, for a
// registry of the caller's; the agent serves its own on /metrics.
func (a *Agent) Collector() prometheus.Collector { return collector{a: a} }

// metricsHandler serves the agent's metrics with the Go runtime's and the
// process's, from a registry of the agent's own (agents in one test
// process must not share the global one).
func (a *Agent) metricsHandler() (http.Handler, error) {
	reg := prometheus.NewRegistry()
	for _, c := range []prometheus.Collector{a.Collector(), collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorLog: promLogger{a}}), nil
}

// promLogger logs promhttp's errors (a failed scrape) through logr.
type promLogger struct{ a *Agent }

func (l promLogger) Println(v ...any) {
	l.a.log.Info("Serving metrics failed", "err", v)
}
