package kubectlplugin

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
)

// PodsReport is `kubectl rdmavisor pods`: every allocation's pod on every
// agent, from the agents' per-pod series.
type PodsReport struct {
	Pods   []*PodTraffic `json:"pods"`
	Errors []string      `json:"errors,omitempty"`
}

// Pods reads the per-pod series of every agent; namespace, if not empty,
// keeps that namespace's pods only.
func (c *Cluster) Pods(ctx context.Context, namespace string) (*PodsReport, error) {
	ms, err := c.scrapeAgents(ctx)
	if err != nil {
		return nil, err
	}
	return podsReport(ms, namespace), nil
}

func podsReport(ms map[string]*agentMetrics, namespace string) *PodsReport {
	r := &PodsReport{Pods: []*PodTraffic{}, Errors: scrapeErrors(ms)}
	for _, m := range ms {
		for _, p := range m.pods {
			if namespace == "" || p.Namespace == namespace {
				r.Pods = append(r.Pods, p)
			}
		}
	}
	slices.SortFunc(r.Pods, comparePods)
	return r
}

func (r *PodsReport) table(w io.Writer) error {
	t := newTable(w, "NAMESPACE", "POD", "NODE", "OPEN", "QUOTA", "MSGS-SENT", "BYTES-SENT", "MSGS-RECV", "BYTES-RECV", "REFUSALS", "DROPPED")
	for _, p := range r.Pods {
		ns, pod := podColumns(p)
		t.row(ns, pod, p.Node, itoa(p.VConnsOpen), itoa(p.VConnQuota), itoa(p.MessagesSent), itoa(p.BytesSent),
			itoa(p.MessagesReceived), itoa(p.BytesReceived), itoa(p.RefusalCount()), itoa(p.DroppedSent+p.DroppedReceived))
	}
	return t.flush()
}

// podColumns names an allocation as its series do: a host service's by
// its id with no namespace, an unbound pod allocation by neither.
func podColumns(p *PodTraffic) (ns, pod string) {
	ns, pod = p.Namespace, p.Pod
	if ns == "" {
		ns = "-"
	}
	if pod == "" {
		pod = "<unbound>"
	}
	return ns, pod
}

// Orders of top's pods (--by).
const (
	byBytes    = "bytes"
	byMessages = "messages"
	byRefusals = "refusals"
)

// TopReport is `kubectl rdmavisor top`: the busiest pods, by what they
// sent and received (or were refused) since their allocation, and the
// peers with the most vconns open.
type TopReport struct {
	By     string         `json:"by"`
	Pods   []*PodTraffic  `json:"pods"`
	Peers  []*PeerTraffic `json:"peers"`
	Errors []string       `json:"errors,omitempty"`
}

// Top reads every agent's metrics and keeps the limit busiest pods
// (of namespace, if not empty) and peers; limit 0 keeps all.
func (c *Cluster) Top(ctx context.Context, namespace, by string, limit int) (*TopReport, error) {
	key, err := topKey(by)
	if err != nil {
		return nil, err
	}
	ms, err := c.scrapeAgents(ctx)
	if err != nil {
		return nil, err
	}
	pods := podsReport(ms, namespace)
	r := &TopReport{By: by, Pods: pods.Pods, Peers: []*PeerTraffic{}, Errors: pods.Errors}
	slices.SortStableFunc(r.Pods, func(a, b *PodTraffic) int { return cmp.Compare(key(b), key(a)) })
	for _, m := range ms {
		r.Peers = append(r.Peers, m.peers...)
	}
	slices.SortFunc(r.Peers, func(a, b *PeerTraffic) int {
		if c := cmp.Compare(b.VConns, a.VConns); c != 0 {
			return c
		}
		return strings.Compare(a.Node+"\x00"+a.Peer+"\x00"+a.Rail, b.Node+"\x00"+b.Peer+"\x00"+b.Rail)
	})
	if limit > 0 {
		r.Pods = r.Pods[:min(limit, len(r.Pods))]
		r.Peers = r.Peers[:min(limit, len(r.Peers))]
	}
	return r, nil
}

func topKey(by string) (func(*PodTraffic) uint64, error) {
	switch by {
	case byBytes:
		return (*PodTraffic).Bytes, nil
	case byMessages:
		return (*PodTraffic).Messages, nil
	case byRefusals:
		return (*PodTraffic).RefusalCount, nil
	}
	return nil, fmt.Errorf("unknown --by %q: want bytes, messages or refusals", by)
}

func (r *TopReport) table(w io.Writer) error {
	fmt.Fprintf(w, "PODS (by %s, since their allocation)\n", r.By)
	t := newTable(w, "NAMESPACE", "POD", "NODE", "BYTES", "MESSAGES", "REFUSALS", "OPEN", "QUOTA")
	for _, p := range r.Pods {
		ns, pod := podColumns(p)
		t.row(ns, pod, p.Node, itoa(p.Bytes()), itoa(p.Messages()), itoa(p.RefusalCount()), itoa(p.VConnsOpen), itoa(p.VConnQuota))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nPEERS (by vconns open)")
	t = newTable(w, "NODE", "PEER", "RAIL", "VCONNS", "RC-QPS", "UC-QPS", "INGRESS-QPS")
	for _, p := range r.Peers {
		t.row(p.Node, p.Peer, p.Rail, itoa(p.VConns), itoa(p.RCQPs), itoa(p.UCQPs), itoa(p.IngressQP))
	}
	return t.flush()
}
