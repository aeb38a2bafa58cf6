package kubectlplugin

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/rdmanode"
)

// ChecksFailed is the error of diagnose when a check failed: the command
// exits non-zero.
type ChecksFailed struct{ Failed, Total int }

func (e *ChecksFailed) Error() string {
	return fmt.Sprintf("%d of %d checks failed", e.Failed, e.Total)
}

// resourceDomain is the domain of every RDMAService's resourceName.
const resourceDomain = v1alpha1.ResourceDomain + "/"

// Check is one of diagnose's verdicts.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Reason string `json:"reason"`
}

// Diagnosis is `kubectl rdmavisor diagnose`: why a pod may not reach an
// address, check by check.
type Diagnosis struct {
	Namespace string  `json:"namespace"`
	Pod       string  `json:"pod"`
	Node      string  `json:"node,omitempty"`
	To        string  `json:"to,omitempty"`
	OK        bool    `json:"ok"`
	Checks    []Check `json:"checks"`
}

func (d *Diagnosis) add(name string, ok bool, format string, args ...any) {
	d.Checks = append(d.Checks, Check{Name: name, OK: ok, Reason: fmt.Sprintf(format, args...)})
	d.OK = d.OK && ok
}

// Failed is the number of checks that failed.
func (d *Diagnosis) Failed() int {
	n := 0
	for _, c := range d.Checks {
		if !c.OK {
			n++
		}
	}
	return n
}

// nodeFacts is what diagnose reads of one node.
type nodeFacts struct {
	name    string
	rn      *v1alpha1.RDMANode // nil: none
	agent   *corev1.Pod        // nil: none
	metrics *agentMetrics      // nil: no agent to scrape
}

func (c *Cluster) nodeFacts(ctx context.Context, node string, agents map[string]*corev1.Pod) (*nodeFacts, error) {
	rn, err := c.node(ctx, node)
	if err != nil {
		return nil, err
	}
	f := &nodeFacts{name: node, rn: rn, agent: agents[node]}
	if f.agent != nil {
		f.metrics = c.scrapeOne(ctx, node, f.agent)
	}
	return f, nil
}

// Diagnose checks what a pod needs to reach to (a pod's IP, IP:port, name
// or namespace/name; empty: no destination checks).
func (c *Cluster) Diagnose(ctx context.Context, namespace, name, to string) (*Diagnosis, error) {
	d := &Diagnosis{Namespace: namespace, Pod: name, To: to, OK: true, Checks: []Check{}}
	pod, err := c.Kube.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		d.add("pod", false, "pod %s/%s not found", namespace, name)
		return d, nil
	}
	if err != nil {
		return nil, fmt.Errorf("getting pod %s/%s: %w", namespace, name, err)
	}
	if !podCheck(d, "pod", pod) {
		return d, nil
	}
	d.Node = pod.Spec.NodeName
	agents, err := c.agentPods(ctx)
	if err != nil {
		return nil, err
	}
	src, err := c.nodeFacts(ctx, pod.Spec.NodeName, agents)
	if err != nil {
		return nil, err
	}
	requestCheck(d, pod)
	if err := c.eventCheck(ctx, d, pod); err != nil {
		return nil, err
	}
	agentCheck(d, "agent", src)
	conditionsCheck(d, "rdmanode", src)
	railsCheck(d, "rails", src)
	quotaChecks(d, src, pod)
	if err := c.limitsCheck(ctx, d, src); err != nil {
		return nil, err
	}
	if to != "" {
		if err := c.destinationChecks(ctx, d, src, to, agents); err != nil {
			return nil, err
		}
	}
	return d, nil
}

// podCheck: the pod is scheduled and running; false when there is no
// node to check further.
func podCheck(d *Diagnosis, name string, p *corev1.Pod) bool {
	id := p.Namespace + "/" + p.Name
	switch {
	case p.Spec.NodeName == "":
		why := "not scheduled"
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Message != "" {
				why += ": " + c.Message
			}
		}
		d.add(name, false, "%s is %s", id, why)
		return false
	case p.Status.Phase != corev1.PodRunning:
		d.add(name, false, "%s on %s is %s, not Running", id, p.Spec.NodeName, p.Status.Phase)
	default:
		d.add(name, true, "%s (%s) runs on %s", id, orNone(p.Status.PodIP), p.Spec.NodeName)
	}
	return true
}

// requestCheck: the pod asks for vconns, by an extended resource of
// RDMAvisor's domain or a resource claim.
func requestCheck(d *Diagnosis, p *corev1.Pod) {
	var asks []string
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, l := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for r, q := range l {
				if s := fmt.Sprintf("%s: %s", r, q.String()); strings.HasPrefix(string(r), resourceDomain) && !slices.Contains(asks, s) {
					asks = append(asks, s)
				}
			}
		}
	}
	for _, rc := range p.Spec.ResourceClaims {
		asks = append(asks, "resource claim "+rc.Name)
	}
	if len(asks) == 0 {
		d.add("vconn request", false, "the pod requests no %s* resource and no resource claim: it gets no vconns", resourceDomain)
		return
	}
	slices.Sort(asks)
	d.add("vconn request", true, "requests %s", strings.Join(asks, ", "))
}

// eventCheck: the agent recorded that it allocated the pod's vconns.
func (c *Cluster) eventCheck(ctx context.Context, d *Diagnosis, p *corev1.Pod) error {
	events := c.Kube.EventsV1().Events(p.Namespace)
	l, err := events.List(ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + p.Name})
	if apierrors.IsBadRequest(err) {
		// A server that does not select events by regarding.name: all
		// of the namespace's, filtered below.
		l, err = events.List(ctx, metav1.ListOptions{})
	}
	if err != nil {
		return fmt.Errorf("listing the Events of pod %s/%s: %w", p.Namespace, p.Name, err)
	}
	for _, e := range l.Items {
		r := e.Regarding
		if e.Reason == rdmanode.ReasonVConnsAllocated && r.Kind == "Pod" && r.Name == p.Name && (r.UID == "" || r.UID == p.UID) {
			d.add("allocation event", true, "%s: %s", e.Reason, e.Note)
			return nil
		}
	}
	d.add("allocation event", false, "no %s Event: no agent allocated vconns to this pod (yet)", rdmanode.ReasonVConnsAllocated)
	return nil
}

// agentCheck: the node's agent pod runs and is ready.
func agentCheck(d *Diagnosis, name string, f *nodeFacts) {
	if f.agent == nil {
		d.add(name, false, "no agent pod on %s", f.name)
		return
	}
	ok, why := podReady(f.agent)
	d.add(name, ok, "%s/%s on %s: %s", f.agent.Namespace, f.agent.Name, f.name, why)
}

// conditionsCheck: the node's RDMANode has every condition True.
func conditionsCheck(d *Diagnosis, name string, f *nodeFacts) {
	if f.rn == nil {
		d.add(name, false, "%s has no RDMANode: no agent reports it", f.name)
		return
	}
	var bad []string
	for _, t := range []string{v1alpha1.ConditionNodeReady, v1alpha1.ConditionDeviceReady, v1alpha1.ConditionPeersReachable} {
		cond := findCondition(f.rn.Status.Conditions, t)
		switch {
		case cond == nil && t == v1alpha1.ConditionNodeReady:
			bad = append(bad, t+" missing")
		case cond != nil && cond.Status != metav1.ConditionTrue:
			bad = append(bad, fmt.Sprintf("%s %s (%s: %s)", t, cond.Status, cond.Reason, cond.Message))
		}
	}
	if len(bad) > 0 {
		d.add(name, false, "RDMANode %s: %s", f.name, strings.Join(bad, "; "))
		return
	}
	d.add(name, true, "RDMANode %s of service %s: Ready", f.name, f.rn.Spec.ServiceName)
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}

// railsCheck: every device of the node is healthy, and its port up in the
// agent's metrics.
func railsCheck(d *Diagnosis, name string, f *nodeFacts) {
	if f.rn == nil || len(f.rn.Status.Devices) == 0 {
		d.add(name, false, "%s reports no RDMA device", f.name)
		return
	}
	var up, down []string
	for _, dev := range f.rn.Status.Devices {
		s := fmt.Sprintf("%d:%s", dev.Rail, dev.Name)
		metricDown := f.metrics != nil && f.metrics.err == nil && railDown(f.metrics, dev.Rail)
		switch {
		case dev.Health != v1alpha1.DeviceHealthy:
			down = append(down, fmt.Sprintf("%s %s (%s)", s, dev.Health, dev.Message))
		case metricDown:
			down = append(down, s+" port down (rdmavisor_rail_up 0)")
		default:
			up = append(up, s)
		}
	}
	if len(down) > 0 {
		d.add(name, false, "%s: rail %s", f.name, strings.Join(down, ", "))
		return
	}
	d.add(name, true, "%s: rail %s up", f.name, strings.Join(up, ", "))
}

// railDown: the agent's metrics show the rail's port down.
func railDown(m *agentMetrics, rail int32) bool {
	up, ok := m.railsUp[itoa(rail)]
	return ok && !up
}

// quotaChecks: the agent's per-pod series of the pod show a vconn free
// and no refusal.
func quotaChecks(d *Diagnosis, f *nodeFacts, p *corev1.Pod) {
	switch {
	case f.metrics == nil:
		d.add("vconn quota", false, "no agent on %s to read the pod's metrics from", f.name)
		return
	case f.metrics.err != nil:
		d.add("vconn quota", false, "%v", f.metrics.err)
		return
	}
	var t *PodTraffic
	for _, pt := range f.metrics.pods {
		if pt.Namespace == p.Namespace && pt.Pod == p.Name {
			t = pt
		}
	}
	switch {
	case t == nil:
		d.add("vconn quota", false, "the agent on %s holds no allocation bound to %s/%s", f.name, p.Namespace, p.Name)
		return
	case t.VConnsOpen >= t.VConnQuota:
		d.add("vconn quota", false, "%d of %d vconns open: the pod's next dial or accept is refused (quota)", t.VConnsOpen, t.VConnQuota)
	default:
		d.add("vconn quota", true, "%d of %d vconns open", t.VConnsOpen, t.VConnQuota)
	}
	refusalsCheck(d, t)
}

// refusalsCheck: none of the pod's requests was refused for its quota, a
// limit, or for want of a listener, since its allocation.
func refusalsCheck(d *Diagnosis, t *PodTraffic) {
	var counts []string
	for _, r := range []string{"quota", "limit", "refused", "address_in_use"} {
		counts = append(counts, fmt.Sprintf("%s %d", r, t.Refusals[r]))
	}
	q, l, r := t.Refusals["quota"], t.Refusals["limit"], t.Refusals["refused"]
	var why []string
	if q > 0 {
		why = append(why, "its vconns or the dialed pod's were all in use")
	}
	if l > 0 {
		why = append(why, "a limit of its allocation (sessions, listeners, regions) was reached")
	}
	if r > 0 {
		why = append(why, "nothing listened at an address it dialed")
	}
	if len(why) > 0 {
		d.add("refusals", false, "%s since its allocation: %s", strings.Join(counts, ", "), strings.Join(why, "; "))
		return
	}
	d.add("refusals", true, "%s since its allocation", strings.Join(counts, ", "))
}

// limitsCheck says the service's spec.limits, which bound the pod's
// allocation; it fails only when the node's service is gone.
func (c *Cluster) limitsCheck(ctx context.Context, d *Diagnosis, f *nodeFacts) error {
	if f.rn == nil {
		return nil
	}
	var svc v1alpha1.RDMAService
	if err := c.CRs.Get(ctx, client.ObjectKey{Name: f.rn.Spec.ServiceName}, &svc); err != nil {
		if client.IgnoreNotFound(err) == nil {
			d.add("limits", false, "RDMAService %s of %s not found", f.rn.Spec.ServiceName, f.name)
			return nil
		}
		return fmt.Errorf("getting RDMAService %s: %w", f.rn.Spec.ServiceName, err)
	}
	if s := limitsString(svc.Spec.Limits); s != "" {
		d.add("limits", true, "RDMAService %s spec.limits: %s", svc.Name, s)
	} else {
		d.add("limits", true, "RDMAService %s sets no spec.limits: the agent's defaults", svc.Name)
	}
	return nil
}

func limitsString(l *v1alpha1.Limits) string {
	if l == nil {
		return ""
	}
	var s []string
	i32 := func(name string, v *int32) {
		if v != nil {
			s = append(s, fmt.Sprintf("%s %d", name, *v))
		}
	}
	qty := func(name string, v *resource.Quantity) {
		if v != nil {
			s = append(s, name+" "+v.String())
		}
	}
	i32("sessions", l.Sessions)
	i32("listeners", l.Listeners)
	i32("regions", l.Regions)
	qty("regionSize", l.RegionSize)
	qty("queuedSize", l.QueuedSize)
	qty("registeredSize", l.RegisteredSize)
	i32("messageRate", l.MessageRate)
	qty("byteRate", l.ByteRate)
	return strings.Join(s, ", ")
}

func (d *Diagnosis) table(w io.Writer) error {
	t := newTable(w, "CHECK", "RESULT", "REASON")
	for _, c := range d.Checks {
		res := "OK"
		if !c.OK {
			res = "FAIL"
		}
		t.row(c.Name, res, c.Reason)
	}
	return t.flush()
}
