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
	m := metricSink(ch)
	// Every rail's engine: the node's figures are their sums, and a peer's
	// QPs and vconns are labelled with the rail they are on.
	var sums railSums
	names := c.a.peerNames()
	for rail, e := range c.a.engines {
		sums.add(m, rail, e, names)
	}
	sums.collect(m)
	c.collectQuota(m)
	c.collectTenants(ch)
}

// metricSink sends constant metrics to a Collect's channel.
type metricSink chan<- prometheus.Metric

func (m metricSink) gauge(d *prometheus.Desc, v float64, labels ...string) {
	m <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func (m metricSink) counter(d *prometheus.Desc, v uint64, labels ...string) {
	m <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
}

// railSums are the node's engine figures, summed over its rails.
type railSums struct {
	states     engine.StateCounts
	sent, recv [engine.NumTransports]engine.Traffic
	rejects    [engine.NumRejectReasons]uint64
	st         engine.Stats
	buffers    []int
	peers      int
	pollers    int // pollers are numbered across the rails, rail 0's first
}

// add adds rail's engine e to the sums, and sends its peers' and pollers'
// metrics, which are not summed; names are the peers' node names.
func (s *railSums) add(m metricSink, rail int, e *engine.Engine, names map[verbs.GID]string) {
	es := e.Stats()
	ps, sc := e.PeerStats()
	s.states.Connecting += sc.Connecting
	s.states.Open += sc.Open
	s.states.Closing += sc.Closing
	s.states.Failed += sc.Failed
	s.peers += len(ps)
	r := strconv.Itoa(rail)
	for _, p := range ps {
		name := names[p.GID]
		if name == "" {
			name = p.GID.String()
		}
		m.gauge(descQPs, float64(p.RCQPs), name, "rc", r)
		m.gauge(descQPs, float64(p.UCQPs), name, "uc", r)
		m.gauge(descQPs, float64(p.IngressQPs), name, "ingress", r)
		m.gauge(descPeerVConns, float64(p.VConns.Open), name, r)
	}
	sent, rv := e.TrafficStats()
	for t := range s.sent {
		s.sent[t].Msgs, s.sent[t].Bytes = s.sent[t].Msgs+sent[t].Msgs, s.sent[t].Bytes+sent[t].Bytes
		s.recv[t].Msgs, s.recv[t].Bytes = s.recv[t].Msgs+rv[t].Msgs, s.recv[t].Bytes+rv[t].Bytes
	}
	for i, n := range e.RejectStats() {
		s.rejects[i] += n
	}
	s.st.Retransmits += es.Retransmits
	s.st.GapResends += es.GapResends
	s.st.CreditStalls += es.CreditStalls
	s.st.Posts += es.Posts
	s.st.WRsPosted += es.WRsPosted
	s.st.StaleDropped += es.StaleDropped
	s.st.Malformed += es.Malformed
	s.st.Sleeps += es.Sleeps
	for i, n := range es.BuffersInUse {
		if i == len(s.buffers) {
			s.buffers = append(s.buffers, 0)
		}
		s.buffers[i] += n
	}
	for _, ps := range e.PollerStats() {
		m <- prometheus.MustNewConstMetric(descPollerBusy, prometheus.CounterValue, ps.Busy.Seconds(), strconv.Itoa(s.pollers))
		s.pollers++
	}
}

// collect sends the node's summed metrics.
func (s *railSums) collect(m metricSink) {
	for _, v := range []struct {
		name string
		n    int
	}{{"connecting", s.states.Connecting}, {"open", s.states.Open}, {"closing", s.states.Closing}, {"failed", s.states.Failed}} {
		m.gauge(descVConns, float64(v.n), v.name)
	}
	m.gauge(descPeers, float64(s.peers))
	for t := transport.RC; t <= transport.Auto; t++ { // no vconn's is Unknown
		tr := t.String()
		m.counter(descMsgsSent, s.sent[t].Msgs, tr)
		m.counter(descBytesSent, s.sent[t].Bytes, tr)
		m.counter(descMsgsRecv, s.recv[t].Msgs, tr)
		m.counter(descBytesRecv, s.recv[t].Bytes, tr)
	}
	m.counter(descRetransmits, s.st.Retransmits-s.st.GapResends, "timeout")
	m.counter(descRetransmits, s.st.GapResends, "gap")
	m.counter(descCreditStalls, s.st.CreditStalls)
	m.counter(descDoorbells, s.st.Posts)
	m.counter(descWRs, s.st.WRsPosted)
	m.counter(descDropped, s.st.StaleDropped, "stale")
	m.counter(descDropped, s.st.Malformed, "malformed")
	for r, n := range s.rejects {
		m.counter(descDropped, n, engine.RejectReason(r).String())
	}
	for i, n := range s.buffers {
		m.gauge(descBuffers, float64(n), strconv.Itoa(i))
	}
	m.counter(descPollerSleeps, s.st.Sleeps)
}

// collectQuota sends the allocations' share of the node's vconns and
// whether each rail is up.
func (c collector) collectQuota(m metricSink) {
	a := c.a
	allocs := a.Allocations()
	allocated, used := 0, 0
	for _, al := range allocs {
		allocated += al.VConns
		used += al.InUse
	}
	m.gauge(descAllocations, float64(len(allocs)))
	m.gauge(descQuota, float64(a.cfg.VConnsPerNode), "capacity")
	m.gauge(descQuota, float64(allocated), "allocated")
	m.gauge(descQuota, float64(used), "used")
	for i, why := range a.railsDown() {
		up := 0.0
		if why == "" {
			up = 1
		}
		m.gauge(descRailUp, up, strconv.Itoa(i), a.devs[i].Attr().Name)
	}
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
