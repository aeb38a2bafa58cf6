// Package agenttest starts node agents in one process for tests and
// examples: package minicluster's two agents, "node-a" on 127.0.0.2 and
// "node-b" on 127.0.0.3, with what tests add to them: application clients
// (Node.Client, Node.PodClient) that resolve names from the test's Hosts,
// and echo and discard servers.
package agenttest

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/minicluster"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// Options configure a Cluster.
type Options = minicluster.Options

// Cluster is a set of agents that know each other.
type Cluster struct {
	*minicluster.Cluster
	// Nodes are the cluster's nodes, with their clients.
	Nodes []*Node
	// Hosts is the DNS of the clients Node.Client and Node.PodClient
	// make: empty until a test sets names (a Service's), so that no test
	// asks the machine's resolver.
	Hosts *Hosts
}

// Node is one agent of the cluster.
type Node struct {
	*minicluster.Node
	c *Cluster
}

// Start starts node-a on 127.0.0.2 and node-b on 127.0.0.3.
func Start(o Options) (*Cluster, error) {
	mc, err := minicluster.Start(o)
	if err != nil {
		return nil, err
	}
	c := &Cluster{Cluster: mc, Hosts: &Hosts{}}
	for _, n := range mc.Nodes {
		c.Nodes = append(c.Nodes, &Node{Node: n, c: c})
	}
	return c, nil
}

// Client allocates k vconns on the node as id and connects an
// application client (package vconn) to them, as a pod would.
func (n *Node) Client(ctx context.Context, id string, k int) (*vconn.Client, error) {
	sock, err := n.Allocate(ctx, id, k)
	if err != nil {
		return nil, err
	}
	return vconn.NewClient(ctx, vconn.Options{Socket: sock, Resolver: n.c.Hosts})
}

// PodClient is Client for a pod: it registers the pod with the node's
// agent (as the CNI plugin's ADD does), allocates k vconns for a pod as
// id, binds them to the pod (as the device plugin does with what the
// kubelet's pod-resources API says) and connects a client to them. The
// client listens and dials as the pod: its port space, its IPs.
func (n *Node) PodClient(ctx context.Context, pod admin.Pod, id string, k int) (*vconn.Client, error) {
	if err := n.Agent.RegisterPod(pod); err != nil {
		return nil, err
	}
	al, err := n.Agent.CreatePodAllocation(id, k)
	if err != nil {
		return nil, err
	}
	if err := n.Agent.BindAllocation(id, pod.Namespace, pod.Name); err != nil {
		return nil, err
	}
	return vconn.NewClient(ctx, vconn.Options{Socket: al.Socket, Resolver: n.c.Hosts})
}

// Hosts is a vconn.Resolver that knows the names it is given.
type Hosts struct {
	mu sync.Mutex
	m  map[string][]netip.Addr
}

// Set makes name resolve to ips.
func (h *Hosts) Set(name string, ips ...netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = make(map[string][]netip.Addr)
	}
	h.m[name] = ips
}

// LookupNetIP answers from the names set, and "no such host" for others.
func (h *Hosts) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ips, ok := h.m[host]; ok {
		return append([]netip.Addr(nil), ips...), nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// ServeDiscard accepts vconns on ln until it closes, reading each to EOF
// and discarding what it reads, then closing it: a peer for tests that only
// need their dials answered.
func ServeDiscard(ln *vconn.Listener) {
	minicluster.Serve(ln, func(c *vconn.Conn) { _, _ = io.Copy(io.Discard, c) })
}

// ServeEcho accepts vconns on ln until it closes, writing back what each
// reads until EOF, then closing it.
func ServeEcho(ln *vconn.Listener) {
	minicluster.Serve(ln, func(c *vconn.Conn) { _, _ = io.Copy(c, c) })
}

// Exchange dials addr from c, accepts the vconn on ln (the listener addr
// reaches), sends msg on it and checks that the accepted side receives it
// whole; both vconns are closed after.
func Exchange(ctx context.Context, c *vconn.Client, ln *vconn.Listener, addr, msg string) error {
	d, err := c.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer d.Close()
	s, err := ln.AcceptVConn()
	if err != nil {
		return err
	}
	defer s.Close()
	if err := d.SendMsg(ctx, []byte(msg)); err != nil {
		return err
	}
	got, err := s.RecvMsg(ctx)
	if err != nil {
		return err
	}
	if string(got.Data) != msg {
		return fmt.Errorf("received %q, want %q", got.Data, msg)
	}
	return nil
}
