package agent

import (
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// tenantHelp says, once for every per-pod series, what its labels are.
const tenantHelp = " Labelled with the allocation's pod (namespace, pod); an allocation for host services with " +
	"namespace empty and its allocation id as pod; a pod's allocation the device plugin has not yet bound, " +
	"whose id is a secret, with both empty. A pod's allocations are summed; its series exist while they do."

var tenantLabels = []string{"namespace", "pod"}

// Per-pod (per-allocation) metrics; their number is bounded by the
// node's allocations, at most vconnsPerNode (docs/architecture.md, Metrics).
var (
	descPodVConns = prometheus.NewDesc("rdmavisor_pod_vconns_open",
		"Vconns the pod has open, dialled or accepted (its quota in use)."+tenantHelp, tenantLabels, nil)
	descPodQuota = prometheus.NewDesc("rdmavisor_pod_vconn_quota",
		"Vconns allocated to the pod: at most this many open at once."+tenantHelp, tenantLabels, nil)
	descPodMsgsSent = prometheus.NewDesc("rdmavisor_pod_messages_sent_total",
		"Messages of the pod's vconns handed to the device."+tenantHelp, tenantLabels, nil)
	descPodBytesSent = prometheus.NewDesc("rdmavisor_pod_sent_bytes_total",
		"Payload bytes of the pod's messages sent."+tenantHelp, tenantLabels, nil)
	descPodMsgsRecv = prometheus.NewDesc("rdmavisor_pod_messages_received_total",
		"Messages of the pod's vconns delivered to the pod."+tenantHelp, tenantLabels, nil)
	descPodBytesRecv = prometheus.NewDesc("rdmavisor_pod_received_bytes_total",
		"Payload bytes of the pod's messages received."+tenantHelp, tenantLabels, nil)
	descPodDropped = prometheus.NewDesc("rdmavisor_pod_messages_dropped_total",
		"Messages of the pod's vconns the agent did not carry, by direction: sent (the engine failed the send: "+
			"too large, the vconn failed or closed) or received (not delivered: larger than the pod's way of "+
			"receiving takes, or the vconn or the pod's side ended). Drops in the engine are rdmavisor_messages_dropped_total's."+
			tenantHelp, append(slices.Clone(tenantLabels), "direction"), nil)
	descPodRefusals = prometheus.NewDesc("rdmavisor_pod_refusals_total",
		"Requests of the pod refused, by reason: quota (its vconns, or those of the pod it dialed, all in use), "+
			"limit (a limit of its allocation: sessions, listeners, regions), refused (nothing listens at the "+
			"address dialed), address_in_use (the port listened on has a listener)."+tenantHelp,
		append(slices.Clone(tenantLabels), "reason"), nil)
)

var tenantDescs = []*prometheus.Desc{descPodVConns, descPodQuota, descPodMsgsSent, descPodBytesSent,
	descPodMsgsRecv, descPodBytesRecv, descPodDropped, descPodRefusals}

// tenantSample is the sum of one pod's allocations' figures.
type tenantSample struct {
	open, quota                              int
	sentMsgs, sentBytes, recvMsgs, recvBytes uint64
	sendsDropped, recvsDropped               uint64
	refusals                                 [numRefusals]uint64
}

// tenantKey is the namespace and pod an allocation's series are labelled
// with (tenantHelp). The id of a pod's allocation is never a label:
// derived with the device plugin's key (deviceplugin.AllocationID), it
// is what keeps other users of the node from its socket, and /metrics is
// served to whoever reaches the node.
func (al *allocation) tenantKey() [2]string {
	al.mu.Lock()
	pod := al.pod
	al.mu.Unlock()
	switch {
	case pod != "":
		ns, name, _ := strings.Cut(pod, "/")
		return [2]string{ns, name}
	case al.podScoped:
		return [2]string{}
	}
	return [2]string{"", al.id}
}

// tenants reads the live allocations' counters, summed by pod.
func (a *Agent) tenants() map[[2]string]*tenantSample {
	a.mu.Lock()
	als := slices.Collect(maps.Values(a.allocs))
	a.mu.Unlock()
	out := make(map[[2]string]*tenantSample, len(als))
	for _, al := range als {
		k := al.tenantKey()
		s := out[k]
		if s == nil {
			s = &tenantSample{}
			out[k] = s
		}
		al.mu.Lock()
		s.open += al.used
		s.quota += al.quota
		al.mu.Unlock()
		st := &al.stats
		s.sentMsgs += st.sentMsgs.Load()
		s.sentBytes += st.sentBytes.Load()
		s.recvMsgs += st.recvMsgs.Load()
		s.recvBytes += st.recvBytes.Load()
		s.sendsDropped += st.sendsDropped.Load()
		s.recvsDropped += st.recvsDropped.Load()
		for r := range s.refusals {
			s.refusals[r] += st.refusals[r].Load()
		}
	}
	return out
}

// collectTenants sends the per-pod series.
func (c collector) collectTenants(ch chan<- prometheus.Metric) {
	for k, s := range c.a.tenants() {
		ns, pod := k[0], k[1]
		gauge := func(d *prometheus.Desc, v int) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), ns, pod)
		}
		counter := func(d *prometheus.Desc, v uint64, more ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), append([]string{ns, pod}, more...)...)
		}
		gauge(descPodVConns, s.open)
		gauge(descPodQuota, s.quota)
		counter(descPodMsgsSent, s.sentMsgs)
		counter(descPodBytesSent, s.sentBytes)
		counter(descPodMsgsRecv, s.recvMsgs)
		counter(descPodBytesRecv, s.recvBytes)
		counter(descPodDropped, s.sendsDropped, "sent")
		counter(descPodDropped, s.recvsDropped, "received")
		for r, n := range s.refusals {
			counter(descPodRefusals, n, refusal(r).String())
		}
	}
}
