package controllers

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// Condition reasons of an RDMAService.
const (
	ReasonAllNodesReady   = "AllNodesReady"
	ReasonNodesNotReady   = "NodesNotReady"
	ReasonNodeUnhealthy   = "NodeUnhealthy"
	ReasonNodeUnreachable = "NodeUnreachable"
	ReasonDeviceUnhealthy = "DeviceUnhealthy"
	// ReasonDeviceUnavailable: some nodes' agents cannot open their RDMA
	// device (none there, no such name, port down, GID index out of
	// range); the message names the nodes and why.
	ReasonDeviceUnavailable = "DeviceUnavailable"
	ReasonNoNodes           = "NoNodes"
	ReasonConflict          = "Conflict"
	ReasonNoConflict        = "NoConflict"
	ReasonWaitingForNodes   = "WaitingForNodes"
	ReasonComplete          = "Complete"
	// ReasonRollingOut: the agents' DaemonSet has not finished rolling
	// out the current spec.
	ReasonRollingOut     = "RollingOut"
	ReasonAsExpected     = "AsExpected"
	ReasonReconcileError = "ReconcileError"
)

// annotationServiceGeneration on the agents' DaemonSet is the generation
// of the RDMAService it was rendered from.
const annotationServiceGeneration = "rdmavisor.io/service-generation"

// indexServiceName indexes RDMANodes by spec.serviceName in the cache.
const indexServiceName = "spec.serviceName"

// nodeReport is what one RDMANode says about its node.
type nodeReport struct {
	name string
	// problem is why the node is unhealthy; empty when it is not.
	problem string
	ready   bool
	// pending: no report yet, or readiness unknown.
	pending bool
	// badDevices names the unhealthy devices of a node that may still be
	// ready, each with why where its agent says (a rail that is down).
	badDevices []string
	// noDevice: the agent reports that its device does not open.
	noDevice bool
	// expires is when a ready node's heartbeat becomes too old.
	expires time.Time
}

// assess reads one RDMANode; rn is nil when the agent has not written it yet.
func assess(name string, rn *v1alpha1.RDMANode, now time.Time, timeout time.Duration) nodeReport {
	rep := nodeReport{name: name}
	if rn == nil {
		rep.pending = true
		return rep
	}
	for _, d := range rn.Status.Devices {
		if d.Health == v1alpha1.DeviceUnhealthy {
			bad := d.Name
			if d.Message != "" {
				bad += " (" + d.Message + ")"
			}
			rep.badDevices = append(rep.badDevices, bad)
		}
	}
	if c := meta.FindStatusCondition(rn.Status.Conditions, v1alpha1.ConditionDeviceReady); c != nil && c.Status == metav1.ConditionFalse {
		rep.noDevice = true
	}
	cond := meta.FindStatusCondition(rn.Status.Conditions, v1alpha1.ConditionNodeReady)
	switch {
	case cond == nil || cond.Status == metav1.ConditionUnknown:
		rep.pending = true
	case cond.Status == metav1.ConditionFalse:
		rep.problem = cond.Reason
		if cond.Message != "" {
			rep.problem += ": " + cond.Message
		}
	case rn.Status.HeartbeatTime == nil || now.Sub(rn.Status.HeartbeatTime.Time) > timeout:
		rep.problem = fmt.Sprintf("no heartbeat for more than %s", timeout)
	default:
		rep.ready = true
		rep.expires = rn.Status.HeartbeatTime.Add(timeout)
	}
	return rep
}

// updateStatus aggregates the RDMANodes of the desired nodes into svc.Status
// and returns when to look again: a ready node whose heartbeat stops must turn
// the service not ready even if nothing else changes.
func (r *RDMAServiceReconciler) updateStatus(ctx context.Context, svc *v1alpha1.RDMAService, p *placement) (time.Duration, error) {
	var list v1alpha1.RDMANodeList
	if err := r.List(ctx, &list, client.MatchingFields{indexServiceName: svc.Name}); err != nil {
		return 0, fmt.Errorf("listing RDMANodes: %w", err)
	}
	byName := make(map[string]*v1alpha1.RDMANode, len(list.Items))
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}

	st := &svc.Status
	st.DesiredNodes, st.ReadyNodes = int32(len(p.desired)), 0
	st.VConnCapacity, st.VConnsAllocated, st.VConnsInUse, st.QPsInUse = 0, 0, 0, 0
	t := r.tallyNodes(st, p.desired, byName)
	st.Nodes = fmt.Sprintf("%d/%d", st.ReadyNodes, st.DesiredNodes)
	r.setCondition(svc, readyCondition(p, st.Nodes, &t))

	progressing, err := r.rollout(ctx, svc, p)
	if err != nil {
		return 0, err
	}
	if progressing.Status == metav1.ConditionFalse && len(t.pending) > 0 {
		progressing.Status, progressing.Reason = metav1.ConditionTrue, ReasonWaitingForNodes
		progressing.Message = "waiting for the agents of " + summarize(t.pending)
	}
	r.setCondition(svc, progressing)

	desired := make(map[string]*v1alpha1.RDMANode, len(p.desired))
	for _, name := range p.desired {
		desired[name] = byName[name]
	}
	r.setCondition(svc, degradedCondition(len(p.desired), &t, addressConflicts(desired)))
	return t.requeue, nil
}

// nodeTally is what updateStatus gathers from the desired nodes' RDMANodes
// for the service's conditions.
type nodeTally struct {
	unhealthy, pending, badDevices []string
	// unreachable: the nodes whose agents stopped answering, and the
	// ready nodes whose agents say so.
	unreachable []string
	noDevice    int // of the unhealthy nodes, those whose device does not open
	requeue     time.Duration
}

// tallyNodes assesses the RDMANodes of the desired nodes, counting their
// ready nodes and vconns into st.
func (r *RDMAServiceReconciler) tallyNodes(st *v1alpha1.RDMAServiceStatus, desired []string, byName map[string]*v1alpha1.RDMANode) nodeTally {
	now := r.now()
	var t nodeTally
	unreachableFrom := map[string][]string{}
	member := make(map[string]bool, len(desired))
	for _, name := range desired {
		member[name] = true
	}
	for _, name := range desired {
		rn := byName[name]
		rep := assess(name, rn, now, r.heartbeatTimeout())
		switch {
		case rep.ready:
			st.ReadyNodes++
			if d := rep.expires.Sub(now) + time.Second; t.requeue == 0 || d < t.requeue {
				t.requeue = d
			}
		case rep.pending:
			t.pending = append(t.pending, name)
		default:
			t.unhealthy = append(t.unhealthy, "node "+name+": "+rep.problem)
			if rep.noDevice {
				t.noDevice++
			}
		}
		for _, d := range rep.badDevices {
			t.badDevices = append(t.badDevices, "node "+name+" device "+d)
		}
		if rn == nil {
			continue
		}
		if rep.ready {
			for _, peer := range rn.Status.UnreachablePeers {
				if !member[peer] {
					// No node of the service: an agent's word about
					// it says nothing of the service's health.
					continue
				}
				unreachableFrom[peer] = append(unreachableFrom[peer], name)
			}
		}
		st.VConnCapacity += int64(rn.Status.VConnCapacity)
		st.VConnsAllocated += int64(rn.Status.VConnsAllocated)
		st.VConnsInUse += int64(rn.Status.VConnsOpen)
		st.QPsInUse += int64(rn.Status.QPsInUse)
	}
	for _, peer := range slices.Sorted(maps.Keys(unreachableFrom)) {
		t.unreachable = append(t.unreachable, fmt.Sprintf("node %s unreachable from %s", peer, strings.Join(unreachableFrom[peer], ", ")))
	}
	return t
}

// readyCondition is the service's Ready condition; nodes is its
// ready/desired count.
func readyCondition(p *placement, nodes string, t *nodeTally) metav1.Condition {
	ready := metav1.Condition{Type: v1alpha1.ConditionReady}
	switch {
	case p.refused:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonConflict, p.message()
	case len(p.desired) == 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonNoNodes
		ready.Message = "no node is selected, tolerated and free of other RDMAServices"
	case len(t.unhealthy) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonNodeUnhealthy
		ready.Message = summarize(t.unhealthy)
	case len(t.unreachable) > 0:
		ready.Status, ready.Reason, ready.Message = metav1.ConditionFalse, ReasonNodeUnreachable, summarize(t.unreachable)
	case len(t.pending) > 0:
		ready.Status, ready.Reason = metav1.ConditionFalse, ReasonNodesNotReady
		ready.Message = fmt.Sprintf("%s nodes ready; waiting for %s", nodes, summarize(t.pending))
	default:
		ready.Status, ready.Reason = metav1.ConditionTrue, ReasonAllNodesReady
		ready.Message = nodes + " nodes ready"
	}
	return ready
}

// degradedCondition is the service's Degraded condition over its desired
// nodes; conflicts are the addresses two of them list.
func degradedCondition(desired int, t *nodeTally, conflicts []string) metav1.Condition {
	degraded := metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionFalse, Reason: ReasonAsExpected}
	switch {
	case t.noDevice > 0:
		// The message lists every unhealthy node with its agent's reason
		// (DeviceNotFound, PortDown, ...) and error.
		degraded.Status, degraded.Reason = metav1.ConditionTrue, ReasonDeviceUnavailable
		degraded.Message = fmt.Sprintf("the RDMA device does not open on %d of %d nodes: %s", t.noDevice, desired, summarize(t.unhealthy))
	case len(t.unhealthy) > 0:
		degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, ReasonNodeUnhealthy, summarize(t.unhealthy)
	case len(t.unreachable) > 0:
		degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, ReasonNodeUnreachable, summarize(t.unreachable)
	case len(conflicts) > 0:
		degraded.Status, degraded.Reason = metav1.ConditionTrue, ReasonAddressConflict
		degraded.Message = summarize(conflicts) + ": the agents trust neither node's listing of it"
	case len(t.badDevices) > 0:
		degraded.Status, degraded.Reason, degraded.Message = metav1.ConditionTrue, ReasonDeviceUnhealthy, summarize(t.badDevices)+" unhealthy"
	}
	return degraded
}

// rollout is Progressing as the agents' DaemonSet tells it, the way a
// Deployment's condition follows its ReplicaSets: True from a spec change
// until the DaemonSet controller has seen the new template and every
// scheduled agent runs it and is available. Ready alone cannot say that:
// between two nodes of a roll every agent can be ready, some on the old spec.
func (r *RDMAServiceReconciler) rollout(ctx context.Context, svc *v1alpha1.RDMAService, p *placement) (metav1.Condition, error) {
	c := metav1.Condition{Type: v1alpha1.ConditionProgressing, Status: metav1.ConditionFalse, Reason: ReasonComplete}
	if p.refused || len(p.desired) == 0 {
		return c, nil
	}
	var ds appsv1.DaemonSet
	if err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: objectName(svc)}, &ds); err != nil {
		if !apierrors.IsNotFound(err) {
			return c, fmt.Errorf("reading the agents' DaemonSet: %w", err)
		}
		// Just applied; the cache has not seen it yet.
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, ReasonRollingOut, "creating the agents' DaemonSet"
		return c, nil
	}
	st := ds.Status
	c.Status, c.Reason = metav1.ConditionTrue, ReasonRollingOut
	switch {
	case ds.Annotations[annotationServiceGeneration] != strconv.FormatInt(svc.Generation, 10):
		c.Message = fmt.Sprintf("applying generation %d of the service to the agents' DaemonSet", svc.Generation)
	case st.ObservedGeneration < ds.Generation:
		c.Message = fmt.Sprintf("the DaemonSet controller has not yet seen generation %d of the agents' DaemonSet", ds.Generation)
	case st.UpdatedNumberScheduled < st.DesiredNumberScheduled:
		c.Message = fmt.Sprintf("%d of %d agents run the current spec", st.UpdatedNumberScheduled, st.DesiredNumberScheduled)
	case st.NumberAvailable < st.DesiredNumberScheduled || st.NumberUnavailable > 0:
		c.Message = fmt.Sprintf("%d of %d agents available", st.NumberAvailable, st.DesiredNumberScheduled)
	default:
		c.Status, c.Reason = metav1.ConditionFalse, ReasonComplete
		c.Message = fmt.Sprintf("all %d agents run the current spec", st.DesiredNumberScheduled)
	}
	return c, nil
}

// setConflict records the placement's conflicts.
func (r *RDMAServiceReconciler) setConflict(svc *v1alpha1.RDMAService, p *placement) {
	c := metav1.Condition{Type: v1alpha1.ConditionConflict, Status: metav1.ConditionFalse, Reason: ReasonNoConflict}
	if len(p.conflicts) > 0 {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, ReasonConflict, p.message()
	}
	r.setCondition(svc, c)
}

// setReconcileError makes a failed reconcile visible on the service, as
// Degraded: Ready keeps saying what the agents report, so a transient API
// error does not flap it. The next successful reconcile recomputes Degraded.
func (r *RDMAServiceReconciler) setReconcileError(svc *v1alpha1.RDMAService, err error) {
	r.setCondition(svc, metav1.Condition{Type: v1alpha1.ConditionDegraded, Status: metav1.ConditionTrue,
		Reason: ReasonReconcileError, Message: err.Error()})
}

func (r *RDMAServiceReconciler) setCondition(svc *v1alpha1.RDMAService, c metav1.Condition) {
	c.ObservedGeneration = svc.Generation
	if len(c.Message) > 1024 {
		c.Message = c.Message[:1021] + "..."
	}
	old := meta.FindStatusCondition(svc.Status.Conditions, c.Type)
	changed := old == nil || old.Status != c.Status || old.Reason != c.Reason
	meta.SetStatusCondition(&svc.Status.Conditions, c)
	if changed && r.Recorder != nil {
		// The condition's type is the action: the recorder merges Events
		// of one action and reason into a series with the first's note,
		// and Ready and Degraded often change for one reason.
		r.Recorder.Eventf(svc, nil, eventType(c), c.Reason, c.Type, "%s is %s: %s", c.Type, c.Status, c.Message)
	}
}

// eventType is Warning for a condition that says something is wrong
// (a node or device down, a conflict, a refused spec), Normal otherwise.
func eventType(c metav1.Condition) string {
	bad := false
	switch c.Type {
	case v1alpha1.ConditionDegraded, v1alpha1.ConditionConflict:
		bad = c.Status == metav1.ConditionTrue
	case v1alpha1.ConditionReady:
		bad = c.Status == metav1.ConditionFalse && c.Reason != ReasonNodesNotReady
	}
	if bad {
		return corev1.EventTypeWarning
	}
	return corev1.EventTypeNormal
}

// patchStatus writes the status if it changed, so a reconcile that changes
// nothing writes nothing.
func (r *RDMAServiceReconciler) patchStatus(ctx context.Context, before, svc *v1alpha1.RDMAService) error {
	if equality.Semantic.DeepEqual(before.Status, svc.Status) {
		return nil
	}
	if err := r.Status().Patch(ctx, svc, client.MergeFrom(before)); err != nil {
		return fmt.Errorf("patching RDMAService status: %w", err)
	}
	return nil
}

// summarize joins up to 5 items.
func summarize(items []string) string {
	const max = 5
	if len(items) <= max {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(items[:max], "; "), len(items)-max)
}
