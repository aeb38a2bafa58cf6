//go:build e2e

package e2e

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Dynamic Resource Allocation: the service runs with allocation Both, so
// every agent pod has a DRA driver beside its device plugin, and the chart
// installs the DeviceClass with an extended resource of its own
// (draResource), which no device plugin serves.
const (
	draDriver      = "rdmavisor.io"
	draClass       = "vconn.rdmavisor.io"
	draResource    = "rdmavisor.io/vconn-dra"
	claimTemplate  = "vconns" // config/samples/resourceclaimtemplate.yaml
	templateVConns = 4        // what each of its claims consumes
)

// draAllocID is the form of the DRA driver's allocation ids: "dra-" and
// 32 hex digits keyed by the driver's secret.
var draAllocID = regexp.MustCompile(`^dra-[0-9a-f]{32}$`)

// draSlices: every node publishes one ResourceSlice of the driver, pool
// named after the node, with one device (the soft provider's endpoint):
// shared (allowMultipleAllocations), a vconns capacity of the service's
// vconnsPerNode, and the attributes claims select on.
func (e *env) draSlices() {
	e.eventually("a ResourceSlice of every node", 2*time.Minute, func() (bool, string) {
		l, err := e.kube.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
		if err != nil {
			return false, err.Error()
		}
		var nodes []string
		for _, s := range l.Items {
			if s.Spec.NodeName == nil || s.Spec.Pool.Name != *s.Spec.NodeName || len(s.Spec.Devices) != 1 {
				return false, fmt.Sprintf("slice %s: node %v pool %s, %d devices", s.Name, s.Spec.NodeName, s.Spec.Pool.Name, len(s.Spec.Devices))
			}
			d := s.Spec.Devices[0]
			c, ok := d.Capacity["vconns"]
			if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations || !ok || c.Value.Value() != e.capacity {
				return false, fmt.Sprintf("slice %s device %s: shared %v, capacity %v", s.Name, d.Name, d.AllowMultipleAllocations, d.Capacity)
			}
			if tr := d.Attributes["transport"].StringValue; tr == nil || *tr != "UDP" {
				return false, fmt.Sprintf("slice %s device %s: attributes %v, want transport UDP", s.Name, d.Name, d.Attributes)
			}
			nodes = append(nodes, *s.Spec.NodeName)
		}
		slices.Sort(nodes)
		return slices.Equal(nodes, e.nodes), fmt.Sprintf("slices of %v, want %v", nodes, e.nodes)
	})
	out := e.run(e.kubectl, "get", "resourceslices", "-o", "wide")
	e.t.Logf("kubectl get resourceslices:\n%s", out)
}

// draPod is an echo client whose vconns come from DRA: from a claim of the
// sample template (vconns 0), or from draResource (vconns > 0), which the
// scheduler turns into a claim of the chart's DeviceClass.
func (e *env) draPod(name, node string, vconns int64, l load) *corev1.Pod {
	p := e.echoPod(name, node, 1, "client", fmt.Sprintf("--addr=%s:%d", e.podIP("echo-server"), echoPort),
		fmt.Sprintf("--conns=%d", l.conns), fmt.Sprintf("--messages=%d", l.msgs), fmt.Sprintf("--size=%d", l.size),
		"--timeout=5m", "--hold", "--verdict=/dev/termination-log")
	c := &p.Spec.Containers[0]
	if vconns > 0 {
		c.Resources.Limits = corev1.ResourceList{draResource: *resource.NewQuantity(vconns, resource.DecimalSI)}
		return p
	}
	c.Resources.Limits = nil
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "vconns", ResourceClaimTemplateName: new(claimTemplate)}}
	c.Resources.Claims = []corev1.ResourceClaim{{Name: "vconns"}}
	return p
}

// claimOf is the ResourceClaim that holds pod's vconns: the template's
// (named in its status) or the scheduler's, for an extended resource.
func (e *env) claimOf(pod string) *resourcev1.ResourceClaim {
	e.t.Helper()
	var claim *resourcev1.ResourceClaim
	e.eventually("pod "+pod+"'s claim", time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		name := ""
		if s := p.Status.ExtendedResourceClaimStatus; s != nil {
			name = s.ResourceClaimName
		}
		for _, s := range p.Status.ResourceClaimStatuses {
			if s.ResourceClaimName != nil {
				name = *s.ResourceClaimName
			}
		}
		if name == "" {
			return false, "no claim in its status yet"
		}
		claim, err = e.kube.ResourceV1().ResourceClaims("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return claim.Status.Allocation != nil, "claim " + name + " not allocated"
	})
	return claim
}

// claimAllocated checks the claim's allocation: one device of node's pool,
// consuming vconns; and that node's agent holds it as an allocation of
// exactly vconns, bound to pod.
func (e *env) claimAllocated(claim *resourcev1.ResourceClaim, node, pod string, vconns int64) allocation {
	e.t.Helper()
	res := claim.Status.Allocation.Devices.Results
	if len(res) != 1 || res[0].Driver != draDriver || res[0].Pool != node {
		e.t.Fatalf("claim %s: results %+v, want one device of %s's pool", claim.Name, res, node)
	}
	if q, ok := res[0].ConsumedCapacity["vconns"]; !ok || q.Value() != vconns {
		e.t.Fatalf("claim %s consumes %v, want vconns %d", claim.Name, res[0].ConsumedCapacity, vconns)
	}
	// The id is keyed by the driver's secret (internal/dra's
	// allocationID): found by its pod, never the claim's UID in the clear.
	for _, a := range e.allocations(node) {
		if !draAllocID.MatchString(a.ID) || a.Pod != "default/"+pod {
			continue
		}
		if int64(a.VConns) != vconns || strings.Contains(a.ID, string(claim.UID)) {
			e.t.Fatalf("the agent on %s holds %+v for claim %s, want %d vconns bound to default/%s, its id keyed", node, a, claim.Name, vconns, pod)
		}
		return a
	}
	e.t.Fatalf("the agent on %s holds no DRA allocation bound to default/%s for claim %s: %+v", node, pod, claim.Name, e.allocations(node))
	return allocation{}
}

// dra: a pod with a claim of the sample template and a pod with the DRA
// class's extended resource, on two nodes, each echo with the server on a
// third over as many vconns as their claims consume: the agents hold
// allocations of exactly that quota, which deleting a pod releases.
func (e *env) dra() {
	e.draSlices()
	e.run(e.kubectl, "apply", "-n", "default", "-f", "config/samples/resourceclaimtemplate.yaml")
	claimNode, extNode := e.clientNode(), e.nodes[len(e.nodes)-1]
	before := map[string][]allocation{claimNode: e.liveAllocations(claimNode), extNode: e.liveAllocations(extNode)}

	// The template's claim: 4 vconns, all of them used at once. The
	// extended resource: one device of the class per unit, each consuming
	// the capacity's default (1 vconn), and a node has one device. One
	// client after the other: the machine running the cluster is small.
	full := load{conns: templateVConns, msgs: 200, size: 4096}
	e.createPod(e.draPod("dra-claim", claimNode, 0, full))
	e.clientOK("dra-claim", full, 3*time.Minute)
	ext := load{conns: 1, msgs: 200, size: 4096}
	e.createPod(e.draPod("dra-ext", extNode, 1, ext))
	e.clientOK("dra-ext", ext, 3*time.Minute)
	claim := e.claimOf("dra-claim")
	extClaim := e.claimOf("dra-ext")
	e.claimAllocated(claim, claimNode, "dra-claim", templateVConns)
	e.claimAllocated(extClaim, extNode, "dra-ext", 1)
	e.refusedAllocation(claimNode)

	// The quota is exact: a fifth vconn on the template's claim is refused
	// by the client's agent, with the quota's code and the claim's
	// allocation named, and the four others deliver every message.
	over := load{conns: templateVConns + 1, msgs: 10, size: 64}
	e.createPod(e.draPod("dra-over", claimNode, 0, over))
	refusal := regexp.MustCompile(fmt.Sprintf(`allocation dra-[0-9a-f]{32} has all its %d vconns in use`, templateVConns))
	e.eventually("dra-over refused its fifth vconn", 3*time.Minute, func() (bool, string) {
		v, ok, why := e.verdictOf("dra-over")
		if !ok {
			return false, why
		}
		if v.OK {
			e.t.Fatalf("dra-over opened %d vconns on a claim of %d", over.conns, templateVConns)
		}
		// vconn.ErrQuota's text, then the agent's reason (internal/agent's
		// listen.go): not the server's allocation, nor any other failure.
		if !strings.Contains(v.Error, "vconn quota exhausted: dial ") || !refusal.MatchString(v.Error) {
			e.t.Fatalf("dra-over failed with %q, want the quota's refusal: %q", v.Error, refusal)
		}
		if want := int64(templateVConns * over.msgs); v.Sent != want || v.Delivered != want || len(v.VConns) != 1 || v.VConns[0].Sent != 0 {
			e.t.Fatalf("dra-over: verdict %+v, want %d messages sent and delivered on the %d vconns of the claim, and one vconn refused", v, want, templateVConns)
		}
		return true, ""
	})
	e.t.Logf("dra-over: %s", must(e.verdictOf("dra-over")).Error)
	e.deletePod("dra-over")
	e.claimTooLarge()

	// Deleted, a pod's claim is unprepared at once: its allocation gone,
	// the template's claim deleted with its pod.
	e.deletePod("dra-claim")
	e.deletePod("dra-ext")
	for node, want := range before {
		e.allocationsBackTo(node, want)
	}
	e.eventually("the pods' claims gone", 2*time.Minute, func() (bool, string) {
		for _, c := range []string{claim.Name, extClaim.Name} {
			if _, err := e.kube.ResourceV1().ResourceClaims("default").Get(e.ctx, c, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				return false, fmt.Sprintf("claim %s: %v", c, err)
			}
		}
		return true, ""
	})
	e.run(e.kubectl, "delete", "-n", "default", "-f", "config/samples/resourceclaimtemplate.yaml")
}

// refusedAllocation: with allocation Both the device plugin advertises
// the node's whole capacity while DRA claims hold part of it (here
// dra-claim's), so a pod may be given devices its agent cannot back. It
// asks for every device the kubelet still has on node: the agent refuses,
// the kubelet fails the pod at admission (UnexpectedAdmissionError) and
// records a Warning Event on it with the agent's reason, which `kubectl
// describe pod` shows; the agent holds nothing more.
func (e *env) refusedAllocation(node string) {
	const name = "refused"
	held := map[string]bool{}
	for _, a := range e.allocations(node) {
		held[a.ID] = true
	}
	pods, err := e.kube.CoreV1().Pods("").List(e.ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		e.t.Fatal(err)
	}
	free := e.capacity
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, c := range p.Spec.Containers {
			free -= c.Resources.Limits.Name(e.resource, resource.DecimalSI).Value()
		}
	}
	e.createPod(e.echoPod(name, node, free, "server", fmt.Sprintf("--port=%d", echoPort)))
	var note string
	e.eventually(name+" refused at admission, the agent's reason in an Event on it", 2*time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase != corev1.PodFailed || p.Status.Reason != "UnexpectedAdmissionError" {
			return false, fmt.Sprintf("phase %s, reason %q: %s", p.Status.Phase, p.Status.Reason, p.Status.Message)
		}
		ev := e.eventOf("Pod", name, "UnexpectedAdmissionError")
		if ev == nil {
			return false, "no UnexpectedAdmissionError Event on the pod yet"
		}
		note = ev.Note
		return true, ""
	})
	// The device plugin's error, with the agent's (internal/agent's
	// alloc.go, admin.ErrQuota).
	if !strings.Contains(note, "not enough vconns left on the node") || !strings.Contains(note, fmt.Sprintf("of %d vconns", free)) {
		e.t.Fatalf("the Event on %s says %q, want the agent's refusal of %d vconns", name, note, free)
	}
	e.t.Logf("%s (%d vconns): Warning UnexpectedAdmissionError: %s", name, free, note)
	// The device plugin rolled back what it made before answering.
	for _, a := range e.allocations(node) {
		if !held[a.ID] {
			e.t.Fatalf("the agent on %s holds %+v after refusing %s", node, a, name)
		}
	}
	e.deletePod(name)
}

// claimTooLarge: a claim asking one vconn more than any device has stays
// unallocated, and its pod Pending with the scheduler's reason; deleted,
// they leave no allocation behind.
func (e *env) claimTooLarge() {
	const name = "dra-too-large"
	claim := &resourcev1.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{{
			Name: "vconns",
			Exactly: &resourcev1.ExactDeviceRequest{DeviceClassName: draClass, AllocationMode: resourcev1.DeviceAllocationModeExactCount, Count: 1,
				Capacity: &resourcev1.CapacityRequirements{Requests: map[resourcev1.QualifiedName]resource.Quantity{
					"vconns": *resource.NewQuantity(e.capacity+1, resource.DecimalSI)}}},
		}}}},
	}
	if _, err := e.kube.ResourceV1().ResourceClaims("default").Create(e.ctx, claim, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	held := map[string][]allocation{}
	for _, n := range e.nodes {
		held[n] = e.liveAllocations(n)
	}
	p := e.draPod(name, "", 0, load{conns: 1, msgs: 1, size: 64})
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "vconns", ResourceClaimName: new(name)}}
	e.createPod(p)
	e.eventually(name+" unschedulable", time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
				strings.Contains(c.Message, "claim") {
				e.t.Logf("%s: %s", name, c.Message)
				return p.Status.Phase == corev1.PodPending, fmt.Sprintf("phase %s", p.Status.Phase)
			}
		}
		return false, fmt.Sprintf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
	// It stays so: the scheduler does not change its mind, and the claim
	// stays unallocated.
	time.Sleep(3 * time.Second)
	got, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil || got.Status.Phase != corev1.PodPending || got.Spec.NodeName != "" {
		e.t.Fatalf("%s: %v %+v", name, err, got.Status)
	}
	c, err := e.kube.ResourceV1().ResourceClaims("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil || c.Status.Allocation != nil {
		e.t.Fatalf("claim %s: %v, allocation %+v", name, err, c.Status.Allocation)
	}
	e.deletePod(name)
	if err := e.kube.ResourceV1().ResourceClaims("default").Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	for n, want := range held {
		e.allocationsBackTo(n, want)
	}
}

// noSlices: once the service is gone, the kubelets wipe its drivers'
// ResourceSlices (they do so when a driver stays unregistered).
func (e *env) noSlices() (bool, string) {
	l, err := e.kube.ResourceV1().ResourceSlices().List(e.ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + draDriver})
	if err != nil {
		return false, err.Error()
	}
	var names []string
	for _, s := range l.Items {
		names = append(names, s.Name)
	}
	return len(names) == 0, "ResourceSlices " + strings.Join(names, ", ")
}

func must(v verdict, ok bool, why string) verdict {
	if !ok {
		v.Error = why
	}
	return v
}
