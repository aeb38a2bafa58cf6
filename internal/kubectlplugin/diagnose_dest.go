package kubectlplugin

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// destinationChecks: the pod at to runs, its node's agent is ready, the
// two nodes' agents are peers that reach each other, and its rails are up.
func (c *Cluster) destinationChecks(ctx context.Context, d *Diagnosis, src *nodeFacts, to string, agents map[string]*corev1.Pod) error {
	dst, why, err := c.resolve(ctx, d.Namespace, to)
	if err != nil {
		return err
	}
	if dst == nil {
		d.add("destination", false, "%s", why)
		return nil
	}
	if !podCheck(d, "destination", dst) {
		return nil
	}
	df := src
	if dst.Spec.NodeName != src.name {
		if df, err = c.nodeFacts(ctx, dst.Spec.NodeName, agents); err != nil {
			return err
		}
	}
	agentCheck(d, "destination agent", df)
	peerCheck(d, src, df)
	railsCheck(d, "destination rails", df)
	return nil
}

// resolve finds the pod an address names: an IP (with or without a
// port) among the pods' IPs, else a pod's name (namespace/name, or name in
// namespace). No pod: nil and why.
func (c *Cluster) resolve(ctx context.Context, namespace, to string) (*corev1.Pod, string, error) {
	host := to
	if h, _, err := net.SplitHostPort(to); err == nil {
		host = h
	}
	if ip := net.ParseIP(host); ip != nil {
		return c.podByIP(ctx, ip)
	}
	ns, name, ok := strings.Cut(host, "/")
	if !ok {
		ns, name = namespace, host
	}
	p, err := c.Kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Sprintf("pod %s/%s not found", ns, name), nil
	}
	if err != nil {
		return nil, "", fmt.Errorf("getting pod %s/%s: %w", ns, name, err)
	}
	return p, "", nil
}

// podByIP is the live pod, not on the host network, with the IP.
func (c *Cluster) podByIP(ctx context.Context, ip net.IP) (*corev1.Pod, string, error) {
	l, err := c.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("listing pods to find %s: %w", ip, err)
	}
	for i := range l.Items {
		p := &l.Items[i]
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, pip := range p.Status.PodIPs {
			if q := net.ParseIP(pip.IP); q != nil && q.Equal(ip) {
				return p, "", nil
			}
		}
	}
	return nil, fmt.Sprintf("no running pod has IP %s (a vconn address names a pod by its IP)", ip), nil
}

// peerCheck: the source's agent may reach the destination's. Same node:
// the agent connects the two itself. Else both have an RDMANode, neither
// lists the other unreachable; the source's metrics say whether they
// already share QPs (made at the first dial).
func peerCheck(d *Diagnosis, src, dst *nodeFacts) {
	const name = "peer"
	switch {
	case src.name == dst.name:
		d.add(name, true, "same node %s: its agent connects the two pods itself", src.name)
		return
	case src.rn == nil:
		d.add(name, false, "%s has no RDMANode: no agent serves it", src.name)
		return
	case dst.rn == nil:
		d.add(name, false, "%s has no RDMANode: no agent serves it", dst.name)
		return
	case slices.Contains(src.rn.Status.UnreachablePeers, dst.name):
		d.add(name, false, "RDMANode %s lists %s in unreachablePeers: its agent stopped answering heartbeats", src.name, dst.name)
		return
	case slices.Contains(dst.rn.Status.UnreachablePeers, src.name):
		d.add(name, false, "RDMANode %s lists %s in unreachablePeers: its agent stopped answering heartbeats", dst.name, src.name)
		return
	case dst.rn.Status.Address == nil:
		d.add(name, false, "RDMANode %s has no address: its agent has not published where peers reach it", dst.name)
		return
	}
	if src.metrics == nil || src.metrics.err != nil {
		d.add(name, true, "%s and %s reach each other (neither lists the other unreachable); the agent's peers unknown", src.name, dst.name)
		return
	}
	var vconns, qps int64
	found := false
	for _, p := range src.metrics.peers {
		if p.Peer == dst.name {
			found = true
			vconns += p.VConns
			qps += p.RCQPs + p.UCQPs + p.IngressQP
		}
	}
	if !found {
		d.add(name, true, "%s reaches %s; no QPs between them yet (made at the first dial)", src.name, dst.name)
		return
	}
	d.add(name, true, "%s is a peer of %s: %d QPs, %d vconns open, not unreachable", dst.name, src.name, qps, vconns)
}
