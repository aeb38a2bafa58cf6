package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// StatusReport is `kubectl rdmavisor status`: each RDMAService and each
// RDMANode, with the peers each agent's metrics name.
type StatusReport struct {
	Services []ServiceStatus `json:"services"`
	Nodes    []NodeStatus    `json:"nodes"`
	// Errors are the agents whose metrics could not be read: their
	// peers are unknown.
	Errors []string `json:"errors,omitempty"`
}

// ServiceStatus is an RDMAService's status.
type ServiceStatus struct {
	Name            string `json:"name"`
	Ready           string `json:"ready"`
	Progressing     string `json:"progressing"`
	Degraded        string `json:"degraded"`
	Nodes           string `json:"nodes"`
	ReadyNodes      int32  `json:"readyNodes"`
	DesiredNodes    int32  `json:"desiredNodes"`
	VConnCapacity   int64  `json:"vconnCapacity"`
	VConnsAllocated int64  `json:"vconnsAllocated"`
	VConnsOpen      int64  `json:"vconnsOpen"`
}

// NodeStatus is an RDMANode's status and its agent pod's.
type NodeStatus struct {
	Name    string `json:"name"`
	Service string `json:"service"`
	Ready   string `json:"ready"`
	// Agent is the agent pod's state: Ready, NotReady or Missing.
	Agent            string       `json:"agent"`
	AgentPod         string       `json:"agentPod,omitempty"`
	Rails            []RailStatus `json:"rails"`
	Peers            []PeerStatus `json:"peers"`
	PeersKnown       bool         `json:"peersKnown"`
	UnreachablePeers []string     `json:"unreachablePeers"`
	VConnsAllocated  int32        `json:"vconnsAllocated"`
	VConnsOpen       int32        `json:"vconnsOpen"`
	VConnCapacity    int32        `json:"vconnCapacity"`
}

// RailStatus is one of a node's devices.
type RailStatus struct {
	Rail    int32  `json:"rail"`
	Device  string `json:"device"`
	Health  string `json:"health"`
	Message string `json:"message,omitempty"`
}

// PeerStatus is a peer node of an agent: one it holds QPs for (its
// metrics), or one its RDMANode lists unreachable.
type PeerStatus struct {
	Name      string `json:"name"`
	Reachable bool   `json:"reachable"`
	VConns    int64  `json:"vconns"`
	QPs       int64  `json:"qps"`
}

// Status reads the report.
func (c *Cluster) Status(ctx context.Context) (*StatusReport, error) {
	svcs, err := c.services(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := c.nodes(ctx)
	if err != nil {
		return nil, err
	}
	agents, err := c.agentPods(ctx)
	if err != nil {
		return nil, err
	}
	ms := c.scrapeAll(ctx, agents)
	r := &StatusReport{Services: []ServiceStatus{}, Nodes: []NodeStatus{}, Errors: scrapeErrors(ms)}
	for i := range svcs {
		r.Services = append(r.Services, serviceStatus(&svcs[i]))
	}
	for i := range nodes {
		n := &nodes[i]
		ns := nodeStatus(n)
		if p := agents[n.Name]; p != nil {
			ns.AgentPod = p.Namespace + "/" + p.Name
			ns.Agent = "NotReady"
			if ok, _ := podReady(p); ok {
				ns.Agent = "Ready"
			}
		}
		ns.Peers, ns.PeersKnown = peerStatuses(n, ms[n.Name])
		r.Nodes = append(r.Nodes, ns)
	}
	return r, nil
}

func serviceStatus(s *v1alpha1.RDMAService) ServiceStatus {
	st := s.Status
	return ServiceStatus{
		Name: s.Name, Nodes: st.Nodes, ReadyNodes: st.ReadyNodes, DesiredNodes: st.DesiredNodes,
		Ready:           condition(st.Conditions, v1alpha1.ConditionReady),
		Progressing:     condition(st.Conditions, v1alpha1.ConditionProgressing),
		Degraded:        condition(st.Conditions, v1alpha1.ConditionDegraded),
		VConnCapacity:   st.VConnCapacity,
		VConnsAllocated: st.VConnsAllocated,
		VConnsOpen:      st.VConnsInUse,
	}
}

func nodeStatus(n *v1alpha1.RDMANode) NodeStatus {
	st := n.Status
	ns := NodeStatus{
		Name: n.Name, Service: n.Spec.ServiceName, Agent: "Missing",
		Ready:            condition(st.Conditions, v1alpha1.ConditionNodeReady),
		Rails:            []RailStatus{},
		UnreachablePeers: append([]string{}, st.UnreachablePeers...),
		VConnsAllocated:  st.VConnsAllocated, VConnsOpen: st.VConnsOpen, VConnCapacity: st.VConnCapacity,
	}
	for _, d := range st.Devices {
		ns.Rails = append(ns.Rails, RailStatus{Rail: d.Rail, Device: d.Name, Health: string(d.Health), Message: d.Message})
	}
	slices.SortFunc(ns.Rails, func(a, b RailStatus) int { return int(a.Rail - b.Rail) })
	slices.Sort(ns.UnreachablePeers)
	return ns
}

// peerStatuses joins the peers an agent's metrics name with those its
// RDMANode lists unreachable; known is false when the metrics could not
// be read (only the unreachable ones are then listed).
func peerStatuses(n *v1alpha1.RDMANode, m *agentMetrics) (peers []PeerStatus, known bool) {
	byName := map[string]*PeerStatus{}
	get := func(name string) *PeerStatus {
		if byName[name] == nil {
			byName[name] = &PeerStatus{Name: name, Reachable: true}
		}
		return byName[name]
	}
	if m != nil && m.err == nil {
		known = true
		for _, p := range m.peers {
			ps := get(p.Peer)
			ps.VConns += p.VConns
			ps.QPs += p.RCQPs + p.UCQPs + p.IngressQP
		}
	}
	for _, u := range n.Status.UnreachablePeers {
		get(u).Reachable = false
	}
	peers = []PeerStatus{}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		peers = append(peers, *byName[name])
	}
	return peers, known
}

func (r *StatusReport) table(w io.Writer) error {
	fmt.Fprintln(w, "SERVICES")
	t := newTable(w, "SERVICE", "READY", "PROGRESSING", "DEGRADED", "NODES", "CAPACITY", "ALLOCATED", "OPEN")
	for _, s := range r.Services {
		t.row(s.Name, s.Ready, s.Progressing, s.Degraded, orNone(s.Nodes), itoa(s.VConnCapacity), itoa(s.VConnsAllocated), itoa(s.VConnsOpen))
	}
	if err := t.flush(); err != nil {
		return err
	}
	fmt.Fprintln(w, "\nNODES")
	t = newTable(w, "NODE", "SERVICE", "READY", "AGENT", "RAILS", "PEERS", "ALLOCATED", "OPEN", "CAPACITY")
	for _, n := range r.Nodes {
		t.row(n.Name, n.Service, n.Ready, n.Agent, railsColumn(n.Rails), peersColumn(n.Peers, n.PeersKnown),
			itoa(n.VConnsAllocated), itoa(n.VConnsOpen), itoa(n.VConnCapacity))
	}
	return t.flush()
}

func railsColumn(rails []RailStatus) string {
	var s []string
	for _, r := range rails {
		s = append(s, fmt.Sprintf("%d:%s=%s", r.Rail, r.Device, r.Health))
	}
	return orNone(strings.Join(s, ","))
}

// peersColumn names each peer, marking the unreachable ones; "?" stands
// for the peers of an agent whose metrics could not be read.
func peersColumn(peers []PeerStatus, known bool) string {
	var s []string
	for _, p := range peers {
		if p.Reachable {
			s = append(s, p.Name)
		} else {
			s = append(s, p.Name+"(unreachable)")
		}
	}
	if !known {
		s = append(s, "?")
	}
	return orNone(strings.Join(s, ","))
}
