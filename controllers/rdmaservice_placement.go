package controllers

import (
	"context"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// A node runs at most one RDMAvisor agent: the agent owns the node's RDMA
// devices, binds host ports (RoCEv2 UDP, control port) and reports itself in
// the RDMANode named after the node. So every node is served by the oldest
// RDMAService that selects it (creationTimestamp, then name), and a younger
// service that selects it too reports Conflict=True:
//   - with the same node selector as an older service (the same nodes today
//     and tomorrow), it is refused entirely and deploys nothing;
//   - otherwise its DaemonSet gets node affinity excluding the overlap, and
//     it serves the rest of its nodes.
// This is stricter than "same node and same resource name": two services with
// different resource names would still collide on the node's ports and
// RDMANode. Deleting the older service clears the conflict.

// conflict is an older RDMAService that claims some of our nodes.
type conflict struct {
	service      string
	nodes        []string // the overlap, sorted
	sameSelector bool
}

// placement is where a service deploys.
type placement struct {
	// selected are the nodes the node selector matches, sorted.
	selected []string
	// excluded are selected nodes served by an older service, sorted.
	excluded []string
	// desired are the nodes that should run an agent: selected, not excluded,
	// with every NoSchedule/NoExecute taint tolerated. Sorted.
	desired []string
	// refused: same selector as an older service, so nothing is deployed.
	refused   bool
	conflicts []conflict
	// cdi: every desired node's container runtime applies CDI specs
	// (runtimeCDI), so the device plugin may deliver by CDI.
	cdi bool
}

// served are the nodes whose RDMANodes belong to this service: selected and
// not served by another. Taints do not matter here, since a DaemonSet pod
// that runs on a node tainted later keeps running.
func (p *placement) served() []string {
	if p.refused {
		return nil
	}
	return slices.DeleteFunc(slices.Clone(p.selected), func(n string) bool {
		_, found := slices.BinarySearch(p.excluded, n)
		return found
	})
}

// nodeSelector parses a service's node selector; nil selects every node.
func nodeSelector(svc *v1alpha1.RDMAService) (labels.Selector, error) {
	if svc.Spec.NodeSelector == nil {
		return labels.Everything(), nil
	}
	sel, err := metav1.LabelSelectorAsSelector(svc.Spec.NodeSelector)
	if err != nil {
		return nil, reconcile.TerminalError(fmt.Errorf("invalid spec.nodeSelector: %w", err))
	}
	return sel, nil
}

// older reports whether a was created before b: creationTimestamp, then name.
func older(a, b *v1alpha1.RDMAService) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// place computes where svc deploys, from the cached Nodes and RDMAServices.
func (r *RDMAServiceReconciler) place(ctx context.Context, svc *v1alpha1.RDMAService) (*placement, error) {
	log := ctrl.LoggerFrom(ctx)
	sel, err := nodeSelector(svc)
	if err != nil {
		return nil, err
	}
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	var services v1alpha1.RDMAServiceList
	if err := r.List(ctx, &services); err != nil {
		return nil, fmt.Errorf("listing RDMAServices: %w", err)
	}

	p := &placement{}
	byName := make(map[string]*corev1.Node, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		byName[n.Name] = n
		if sel.Matches(labels.Set(n.Labels)) {
			p.selected = append(p.selected, n.Name)
		}
	}
	slices.Sort(p.selected)

	excluded := map[string]bool{}
	for i := range services.Items {
		o := &services.Items[i]
		// A service being deleted gives up its nodes.
		if o.Name == svc.Name || !o.DeletionTimestamp.IsZero() || !older(o, svc) {
			continue
		}
		osel, err := nodeSelector(o)
		if err != nil {
			log.V(1).Info("Ignoring an RDMAService with an invalid node selector", "other", klog.KObj(o), "err", err)
			continue
		}
		c := conflict{service: o.Name, sameSelector: osel.String() == sel.String()}
		for _, n := range p.selected {
			if osel.Matches(labels.Set(byName[n].Labels)) {
				c.nodes = append(c.nodes, n)
				excluded[n] = true
			}
		}
		if c.sameSelector || len(c.nodes) > 0 {
			p.refused = p.refused || c.sameSelector
			p.conflicts = append(p.conflicts, c)
		}
	}
	for n := range excluded {
		p.excluded = append(p.excluded, n)
	}
	slices.Sort(p.excluded)

	if !p.refused {
		tolerations := append(slices.Clone(svc.Spec.Tolerations), daemonSetTolerations...)
		for _, name := range p.selected {
			if !excluded[name] && tolerated(log, byName[name].Spec.Taints, tolerations) {
				p.desired = append(p.desired, name)
			}
		}
	}
	p.cdi = len(p.desired) > 0 && !slices.ContainsFunc(p.desired, func(n string) bool {
		return !runtimeCDI(byName[n].Status.NodeInfo.ContainerRuntimeVersion)
	})
	return p, nil
}

// runtimeCDI reports whether a node's container runtime, as its status
// names it (containerd://1.7.35), applies the CDI devices the kubelet
// passes: containerd from 1.7, CRI-O from 1.23. Unknown runtimes are
// assumed not to, so the device plugin keeps only its mounts and
// environment, which every runtime applies.
func runtimeCDI(version string) bool {
	name, v, ok := strings.Cut(version, "://")
	if !ok {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(v, "v"), "%d.%d", &major, &minor); err != nil {
		return false
	}
	switch name {
	case "containerd":
		return major > 1 || major == 1 && minor >= 7
	case "cri-o":
		return major > 1 || major == 1 && minor >= 23
	}
	return false
}

// daemonSetTolerations are the tolerations the DaemonSet controller adds to
// every DaemonSet pod, so node conditions do not keep agents away.
var daemonSetTolerations = []corev1.Toleration{
	{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute},
	{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
}

// tolerated reports whether every NoSchedule and NoExecute taint is tolerated.
func tolerated(log klog.Logger, taints []corev1.Taint, tolerations []corev1.Toleration) bool {
	for i := range taints {
		t := &taints[i]
		if t.Effect != corev1.TaintEffectNoSchedule && t.Effect != corev1.TaintEffectNoExecute {
			continue
		}
		if !slices.ContainsFunc(tolerations, func(tol corev1.Toleration) bool { return tol.ToleratesTaint(log, t, false) }) {
			return false
		}
	}
	return true
}

// message describes the conflicts for the Conflict condition.
func (p *placement) message() string {
	var b strings.Builder
	for i, c := range p.conflicts {
		if i > 0 {
			b.WriteString("; ")
		}
		switch {
		case c.sameSelector:
			fmt.Fprintf(&b, "RDMAService %s (created earlier) has the same node selector: not deployed", c.service)
		default:
			fmt.Fprintf(&b, "RDMAService %s (created earlier) already serves %s: not deployed there", c.service, nodeList(c.nodes))
		}
	}
	b.WriteString(" (a node runs one RDMAvisor agent)")
	return b.String()
}

// nodeList names up to 5 nodes.
func nodeList(nodes []string) string {
	const max = 5
	if len(nodes) == 1 {
		return "node " + nodes[0]
	}
	if len(nodes) <= max {
		return "nodes " + strings.Join(nodes, ", ")
	}
	return fmt.Sprintf("nodes %s and %d more", strings.Join(nodes[:max], ", "), len(nodes)-max)
}
