package controllers

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// rendered returns empty objects named as the operator names the objects of
// service.
func rendered(service string) []client.Object {
	name := "rdmavisor-agent-" + service
	ns := metav1.ObjectMeta{Name: name, Namespace: testNamespace}
	cluster := metav1.ObjectMeta{Name: name}
	return []client.Object{
		&appsv1.DaemonSet{ObjectMeta: ns},
		&corev1.ConfigMap{ObjectMeta: ns},
		&corev1.ServiceAccount{ObjectMeta: ns},
		&rbacv1.ClusterRoleBinding{ObjectMeta: cluster},
	}
}

func getDaemonSet(t *testing.T, service string) *appsv1.DaemonSet {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Namespace: testNamespace, Name: "rdmavisor-agent-" + service}, ds); err != nil {
		t.Fatalf("getting DaemonSet of %s: %v", service, err)
	}
	return ds
}

func loadConfig(t *testing.T, service string) *config.AgentConfig {
	t.Helper()
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Namespace: testNamespace, Name: "rdmavisor-agent-" + service}, cm); err != nil {
		t.Fatalf("getting ConfigMap of %s: %v", service, err)
	}
	cfg, err := config.Load([]byte(cm.Data["agent.yaml"]))
	if err != nil {
		t.Fatalf("the rendered config does not load: %v\n%s", err, cm.Data["agent.yaml"])
	}
	return cfg
}

func updateService(t *testing.T, name string, mutate func(*v1alpha1.RDMAService)) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		svc := getService(t, name)
		mutate(svc)
		return k8s.Update(testCtx(t), svc)
	})
	if err != nil {
		t.Fatalf("updating RDMAService %s: %v", name, err)
	}
}

func TestLifecycle(t *testing.T) {
	createNodes(t, map[string]string{"lifecycle": "true"}, "life-1", "life-2")
	svc := newService("life", "lifecycle")
	svc.Spec.QPsPerPeer = ptr[int32](4)
	svc.Spec.Tolerations = []corev1.Toleration{{Key: "rdma", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}
	createService(t, svc)

	objs := rendered("life")
	poll.UntilNil(t, 30*time.Second, "rendered objects exist", func() error {
		for _, o := range objs {
			if err := k8s.Get(testCtx(t), client.ObjectKeyFromObject(o), o); err != nil {
				return fmt.Errorf("%T: %w", o, err)
			}
		}
		return nil
	})
	svc = getService(t, "life")
	if !slices.Contains(svc.Finalizers, Finalizer) {
		t.Errorf("finalizers %v lack %s", svc.Finalizers, Finalizer)
	}
	// envtest runs no garbage collector: check the references it would follow.
	for _, o := range objs {
		ref := metav1.GetControllerOf(o)
		if ref == nil || ref.UID != svc.UID || ref.Kind != "RDMAService" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Errorf("%T %s: controller reference %+v, want RDMAService %s", o, o.GetName(), ref, svc.UID)
		}
		if o.GetLabels()[labelManagedBy] != FieldOwner || o.GetLabels()[LabelService] != "life" {
			t.Errorf("%T labels %v", o, o.GetLabels())
		}
	}

	cfg := loadConfig(t, "life")
	if cfg.ServiceName != "life" || cfg.QPsPerPeer != 4 || cfg.VConnsPerNode != 64 || cfg.Device.Provider != config.ProviderSoft ||
		cfg.ResourceName != "rdmavisor.io/vconn" || cfg.PeerDiscovery.Mode != config.DiscoveryKubernetes {
		t.Errorf("rendered config %+v does not follow the spec", cfg)
	}
	// Agents authenticate each other: the CA they mount is published
	// before their DaemonSet, or no pod of it could start.
	if !cfg.TLS.Enabled() {
		t.Error("rendered config without TLS")
	}
	ca := &corev1.ConfigMap{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Namespace: testNamespace, Name: CAName}, ca); err != nil || ca.Data[CABundleKey] == "" {
		t.Errorf("CA ConfigMap %s/%s: %v, data keys %v; want %s published", testNamespace, CAName, err, slices.Collect(maps.Keys(ca.Data)), CABundleKey)
	}

	ds := getDaemonSet(t, "life")
	pod := ds.Spec.Template.Spec
	var containers, inits []string
	for _, c := range pod.Containers {
		containers = append(containers, c.Name)
		if c.Image != testImage {
			t.Errorf("container %s image %q, want the default %q", c.Name, c.Image, testImage)
		}
	}
	for _, c := range pod.InitContainers {
		inits = append(inits, c.Name)
	}
	if !slices.Equal(containers, []string{"agent", "device-plugin"}) || !slices.Equal(inits, []string{"cni"}) {
		t.Errorf("containers %v, init containers %v", containers, inits)
	}
	if cmd := pod.InitContainers[0].Command; len(cmd) < 3 || cmd[0] != "rdmavisor-cni" || cmd[1] != "install" || cmd[2] != "--keep" {
		t.Errorf("CNI installer command %v", cmd)
	}
	// A sidecar: it outlives the agent and uninstalls when the pod goes.
	if rp := pod.InitContainers[0].RestartPolicy; rp == nil || *rp != corev1.ContainerRestartPolicyAlways {
		t.Errorf("CNI installer restart policy %v, want Always (a native sidecar)", rp)
	}
	var hostPaths []string
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	for _, p := range []string{"/var/lib/kubelet/device-plugins", "/var/lib/kubelet/pod-resources", "/var/run/rdmavisor", "/opt/cni/bin", "/etc/cni/net.d"} {
		if !slices.Contains(hostPaths, p) {
			t.Errorf("no host path %s among %v", p, hostPaths)
		}
	}
	if pod.ServiceAccountName != "rdmavisor-agent-life" || !pod.HostNetwork {
		t.Errorf("service account %q, host network %v", pod.ServiceAccountName, pod.HostNetwork)
	}
	terms := pod.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 || terms[0].MatchExpressions[0].Key != "lifecycle" || len(terms[0].MatchFields) != 0 {
		t.Errorf("node affinity %+v, want lifecycle In [true] and no exclusions", terms)
	}
	if len(pod.Tolerations) != 1 || pod.Tolerations[0].Key != "rdma" {
		t.Errorf("tolerations %+v", pod.Tolerations)
	}

	// A spec change reaches the DaemonSet and the config, and rolls the pods.
	oldHash := ds.Spec.Template.Annotations[annotationConfigHash]
	updateService(t, "life", func(s *v1alpha1.RDMAService) {
		s.Spec.QPsPerPeer = ptr[int32](8)
		s.Spec.Agent.Image = "example.test/rdmavisor:v2"
	})
	poll.UntilNil(t, 30*time.Second, "DaemonSet follows the new spec", func() error {
		ds := getDaemonSet(t, "life")
		if img := ds.Spec.Template.Spec.Containers[0].Image; img != "example.test/rdmavisor:v2" {
			return fmt.Errorf("image %s", img)
		}
		if ds.Spec.Template.Annotations[annotationConfigHash] == oldHash {
			return errors.New("config hash unchanged")
		}
		return nil
	})
	if cfg := loadConfig(t, "life"); cfg.QPsPerPeer != 8 {
		t.Errorf("config qpsPerPeer %d, want 8", cfg.QPsPerPeer)
	}

	// Deletion removes everything, RDMANodes of the service included.
	reportNode(t, "life-1", "life", metav1.ConditionTrue, "Serving", "")
	deleteService(t, "life")
	for _, o := range append(objs, &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: "life-1"}}) {
		if err := k8s.Get(testCtx(t), client.ObjectKeyFromObject(o), o); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s left after deletion (err %v)", o, o.GetName(), err)
		}
	}
}

func TestConflict(t *testing.T) {
	createNodes(t, map[string]string{"conflict-a": "true"}, "conf-1")
	createNodes(t, map[string]string{"conflict-a": "true", "conflict-b": "true"}, "conf-2")
	createService(t, newService("conflict-first", "conflict-a"))
	waitCondition(t, "conflict-first", v1alpha1.ConditionConflict, metav1.ConditionFalse, ReasonNoConflict)

	// Overlapping selector: excluded from the overlap (conf-2, all it selects).
	createService(t, newService("conflict-second", "conflict-b"))
	c := waitCondition(t, "conflict-second", v1alpha1.ConditionConflict, metav1.ConditionTrue, ReasonConflict)
	if !strings.Contains(c.Message, "RDMAService conflict-first") || !strings.Contains(c.Message, "node conf-2") {
		t.Errorf("conflict message %q should name the other service and the node", c.Message)
	}
	poll.UntilNil(t, 30*time.Second, "conflict-second excludes conf-2", func() error {
		if got, err := excludedNodes(t, "conflict-second"); err != nil || !slices.Equal(got, []string{"conf-2"}) {
			return fmt.Errorf("excludes %v (err %v), want [conf-2]", got, err)
		}
		return nil
	})
	waitCondition(t, "conflict-second", v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNoNodes)
	waitCondition(t, "conflict-first", v1alpha1.ConditionConflict, metav1.ConditionFalse, ReasonNoConflict)

	// Same selector as an older service: refused, no DaemonSet at all.
	third := newService("conflict-third", "conflict-a")
	createService(t, third)
	c = waitCondition(t, "conflict-third", v1alpha1.ConditionConflict, metav1.ConditionTrue, ReasonConflict)
	if !strings.Contains(c.Message, "conflict-first") || !strings.Contains(c.Message, "same node selector") {
		t.Errorf("conflict message %q", c.Message)
	}
	waitCondition(t, "conflict-third", v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonConflict)
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Namespace: testNamespace, Name: "rdmavisor-agent-conflict-third"}, ds); !apierrors.IsNotFound(err) {
		t.Errorf("refused service has a DaemonSet (err %v)", err)
	}

	// Deleting the first frees its nodes: the second deploys everywhere it
	// selects; the third now yields conf-2 to the second.
	deleteService(t, "conflict-first")
	waitCondition(t, "conflict-second", v1alpha1.ConditionConflict, metav1.ConditionFalse, ReasonNoConflict)
	poll.UntilNil(t, 30*time.Second, "conflict-second deploys to conf-2", func() error {
		if got, err := excludedNodes(t, "conflict-second"); err != nil || len(got) > 0 {
			return fmt.Errorf("still excludes %v (err %v)", got, err)
		}
		return nil
	})
	c = waitCondition(t, "conflict-third", v1alpha1.ConditionConflict, metav1.ConditionTrue, ReasonConflict)
	if !strings.Contains(c.Message, "conflict-second") || !strings.Contains(c.Message, "node conf-2") {
		t.Errorf("conflict message %q", c.Message)
	}
	poll.UntilNil(t, 30*time.Second, "conflict-third deploys to conf-1 only", func() error {
		// The DaemonSet is created after the status that reports the
		// conflict, so it may not exist yet.
		if got, err := excludedNodes(t, "conflict-third"); err != nil || !slices.Equal(got, []string{"conf-2"}) {
			return fmt.Errorf("excludes %v (err %v)", got, err)
		}
		return nil
	})
}

// excludedNodes returns the nodes a service's DaemonSet keeps away from.
func excludedNodes(t *testing.T, service string) ([]string, error) {
	t.Helper()
	ds := &appsv1.DaemonSet{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Namespace: testNamespace, Name: "rdmavisor-agent-" + service}, ds); err != nil {
		return nil, fmt.Errorf("getting DaemonSet of %s: %w", service, err)
	}
	aff := ds.Spec.Template.Spec.Affinity
	if aff == nil || aff.NodeAffinity == nil || aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return nil, nil
	}
	var out []string
	for _, term := range aff.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && f.Operator == corev1.NodeSelectorOpNotIn {
				out = append(out, f.Values...)
			}
		}
	}
	return out, nil
}

func TestStatus(t *testing.T) {
	createNodes(t, map[string]string{"status": "true"}, "stat-1", "stat-2")
	// A node whose taint the service does not tolerate gets no agent.
	createNode(t, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "stat-tainted", Labels: map[string]string{"status": "true"}},
		Spec:       corev1.NodeSpec{Taints: []corev1.Taint{{Key: "gpu", Effect: corev1.TaintEffectNoSchedule}}},
	})
	createService(t, newService("stat", "status"))

	c := waitCondition(t, "stat", v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNodesNotReady)
	if !strings.Contains(c.Message, "0/2") {
		t.Errorf("Ready message %q, want 0/2 nodes", c.Message)
	}
	// envtest runs no DaemonSet controller: the test plays it.
	waitProgressing(t, "stat", "the DaemonSet controller has not yet seen generation 1 of the agents' DaemonSet")
	rollDaemonSet(t, "stat", 2, 1, 1)
	waitProgressing(t, "stat", "1 of 2 agents run the current spec")
	rollDaemonSet(t, "stat", 2, 2, 1)
	waitProgressing(t, "stat", "1 of 2 agents available")
	rollDaemonSet(t, "stat", 2, 2, 2)
	waitCondition(t, "stat", v1alpha1.ConditionProgressing, metav1.ConditionTrue, ReasonWaitingForNodes)

	reportNode(t, "stat-1", "stat", metav1.ConditionTrue, "Serving", "")
	c = waitCondition(t, "stat", v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNodesNotReady)
	reportNode(t, "stat-2", "stat", metav1.ConditionTrue, "Serving", "")
	c = waitCondition(t, "stat", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)
	waitCondition(t, "stat", v1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonComplete)
	waitCondition(t, "stat", v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonAsExpected)
	st := getService(t, "stat").Status
	if st.DesiredNodes != 2 || st.ReadyNodes != 2 || st.Nodes != "2/2" || st.VConnCapacity != 128 || st.VConnsAllocated != 16 || st.VConnsInUse != 10 || st.QPsInUse != 4 {
		t.Errorf("status %+v, want 2/2 nodes, capacity 128, 16 allocated, 10 open, 4 QPs", st)
	}
	if st.ObservedGeneration != getService(t, "stat").Generation {
		t.Errorf("observedGeneration %d", st.ObservedGeneration)
	}

	reportNode(t, "stat-2", "stat", metav1.ConditionFalse, "DeviceLost", "port 1 is down")
	c = waitCondition(t, "stat", v1alpha1.ConditionReady, metav1.ConditionFalse, ReasonNodeUnhealthy)
	if !strings.Contains(c.Message, "node stat-2") || !strings.Contains(c.Message, "DeviceLost: port 1 is down") {
		t.Errorf("Ready message %q should name the node and its reason", c.Message)
	}
	waitCondition(t, "stat", v1alpha1.ConditionDegraded, metav1.ConditionTrue, ReasonNodeUnhealthy)
	// Each change is an Event on the service, a warning when it says
	// something is wrong: kubectl describe rdmaservice shows why.
	waitEvent(t, "stat", corev1.EventTypeWarning, ReasonNodeUnhealthy, "Degraded is True: node stat-2: DeviceLost: port 1 is down")
	waitEvent(t, "stat", corev1.EventTypeNormal, ReasonAllNodesReady, "Ready is True: 2/2 nodes ready")

	reportNode(t, "stat-2", "stat", metav1.ConditionTrue, "Serving", "")
	waitCondition(t, "stat", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)

	// stat-1's agent says stat-2's stopped answering (stat-2 frozen: its
	// own report still says Ready until its heartbeat goes stale); the
	// node-x it names too is no node of the service, so the messages
	// leave it out.
	setUnreachable(t, "stat-1", "node-x", "stat-2")
	for _, cond := range []string{v1alpha1.ConditionReady, v1alpha1.ConditionDegraded} {
		status := metav1.ConditionFalse
		if cond == v1alpha1.ConditionDegraded {
			status = metav1.ConditionTrue
		}
		c = waitCondition(t, "stat", cond, status, ReasonNodeUnreachable)
		if c.Message != "node stat-2 unreachable from stat-1" {
			t.Errorf("%s message %q, want it to name the unreachable node and who says so", cond, c.Message)
		}
	}
	setUnreachable(t, "stat-1")
	waitCondition(t, "stat", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)
	waitCondition(t, "stat", v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonAsExpected)

	// A spec change rolls the agents: Progressing is True, whatever the
	// agents' readiness says, until the DaemonSet has rolled it out.
	svc := getService(t, "stat")
	svc.Spec.QPsPerPeer = ptr[int32](3)
	if err := k8s.Update(testCtx(t), svc); err != nil {
		t.Fatal(err)
	}
	// A cache that has not seen the new DaemonSet yet says "applying
	// generation 2" first; then the DaemonSet controller's turn.
	waitProgressing(t, "stat", "the DaemonSet controller has not yet seen generation 2 of the agents' DaemonSet")
	rollDaemonSet(t, "stat", 2, 0, 2)
	waitProgressing(t, "stat", "0 of 2 agents run the current spec")
	rollDaemonSet(t, "stat", 2, 2, 2)
	waitCondition(t, "stat", v1alpha1.ConditionProgressing, metav1.ConditionFalse, ReasonComplete)
}

// waitEvent waits for an Event on RDMAService name of type and reason
// whose note contains note.
func waitEvent(t *testing.T, name, typ, reason, note string) {
	t.Helper()
	poll.UntilNil(t, 30*time.Second, fmt.Sprintf("a %s Event %s on RDMAService %s", typ, reason, name), func() error {
		var list eventsv1.EventList
		if err := k8s.List(testCtx(t), &list); err != nil {
			return err
		}
		var seen []string
		for _, e := range list.Items {
			if e.Regarding.Kind != "RDMAService" || e.Regarding.Name != name {
				continue
			}
			if e.Type == typ && e.Reason == reason && strings.Contains(e.Note, note) && e.ReportingController == EventSource {
				return nil
			}
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Note)
		}
		return fmt.Errorf("events of the service: %q", seen)
	})
}

// waitProgressing waits for Progressing True, RollingOut, with message.
func waitProgressing(t *testing.T, name, message string) {
	t.Helper()
	poll.UntilNil(t, 30*time.Second, fmt.Sprintf("RDMAService %s Progressing: %s", name, message), func() error {
		c := meta.FindStatusCondition(getService(t, name).Status.Conditions, v1alpha1.ConditionProgressing)
		if c == nil || c.Status != metav1.ConditionTrue || c.Reason != ReasonRollingOut || c.Message != message {
			return fmt.Errorf("Progressing is %+v", c)
		}
		return nil
	})
}

// rollDaemonSet plays the DaemonSet controller for service's agents: it
// has seen the current template, desired agents are scheduled, updated of
// them run it and available are available.
func rollDaemonSet(t *testing.T, service string, desired, updated, available int32) {
	t.Helper()
	ctx := testCtx(t)
	poll.UntilNil(t, 30*time.Second, "the agents' DaemonSet status written", func() error {
		ds := &appsv1.DaemonSet{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: "rdmavisor-agent-" + service}, ds); err != nil {
			return err
		}
		ds.Status = appsv1.DaemonSetStatus{ObservedGeneration: ds.Generation, DesiredNumberScheduled: desired,
			CurrentNumberScheduled: desired, UpdatedNumberScheduled: updated, NumberReady: available,
			NumberAvailable: available, NumberUnavailable: desired - available}
		return k8s.Status().Update(ctx, ds)
	})
}

// setUnreachable writes the peers node's agent reports unreachable.
func setUnreachable(t *testing.T, node string, peers ...string) {
	t.Helper()
	rn := &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := k8s.Get(testCtx(t), client.ObjectKeyFromObject(rn), rn); err != nil {
		t.Fatal(err)
	}
	rn.Status.UnreachablePeers = peers
	rn.Status.HeartbeatTime = ptr(metav1.Now())
	if err := k8s.Status().Update(testCtx(t), rn); err != nil {
		t.Fatal(err)
	}
}

// resourceVersions maps every object of a service to its resourceVersion.
func resourceVersions(t *testing.T, service string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, o := range append(rendered(service), &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: service}}) {
		if err := k8s.Get(testCtx(t), client.ObjectKeyFromObject(o), o); err != nil {
			t.Fatalf("getting %T: %v", o, err)
		}
		out[fmt.Sprintf("%T", o)] = o.GetResourceVersion()
	}
	return out
}

func TestReconcileIsIdempotent(t *testing.T) {
	createNodes(t, map[string]string{"idempotent": "true"}, "idem-1")
	createService(t, newService("idem", "idempotent"))
	reportNode(t, "idem-1", "idem", metav1.ConditionTrue, "Serving", "")
	waitCondition(t, "idem", v1alpha1.ConditionReady, metav1.ConditionTrue, ReasonAllNodesReady)

	// Let the manager finish with the service (its own reconciles of the
	// events above may still be writing: the service must have stayed at
	// one resourceVersion for a while) and its cache catch up, so the
	// direct calls below see what the API server has and race no one.
	var last string
	var since time.Time
	poll.UntilNil(t, 30*time.Second, "the manager is done and its cache current", func() error {
		want := getService(t, "idem").ResourceVersion
		if want != last {
			last, since = want, time.Now()
			return fmt.Errorf("service now at %s", want)
		}
		if d := time.Since(since); d < time.Second {
			return fmt.Errorf("service at %s for only %v", want, d)
		}
		var cached v1alpha1.RDMAService
		if err := mgrCache.Get(testCtx(t), client.ObjectKey{Name: "idem"}, &cached); err != nil {
			return err
		}
		if cached.ResourceVersion != want {
			return fmt.Errorf("cache at %s, server at %s", cached.ResourceVersion, want)
		}
		return nil
	})
	before := resourceVersions(t, "idem")
	for i := range 2 {
		if _, err := rec.Reconcile(testCtx(t), ctrl.Request{NamespacedName: client.ObjectKey{Name: "idem"}}); err != nil {
			t.Fatalf("reconcile %d: %v", i, err)
		}
	}
	after := resourceVersions(t, "idem")
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed from resourceVersion %s to %s on a reconcile with nothing to do", k, v, after[k])
		}
	}
}

func TestReconcileErrorIsReported(t *testing.T) {
	// The schema does not check label syntax; the operator finds out.
	svc := newService("badsel", "badsel")
	svc.Spec.NodeSelector.MatchLabels = map[string]string{"not a label key!": "true"}
	createService(t, svc)
	c := waitCondition(t, "badsel", v1alpha1.ConditionDegraded, metav1.ConditionTrue, ReasonReconcileError)
	if !strings.Contains(c.Message, "invalid spec.nodeSelector") {
		t.Errorf("Degraded message %q should say what is wrong", c.Message)
	}
	if got := getService(t, "badsel").Status.ObservedGeneration; got != 0 {
		t.Errorf("observedGeneration %d set by a failed reconcile", got)
	}

	updateService(t, "badsel", func(s *v1alpha1.RDMAService) { s.Spec.NodeSelector.MatchLabels = map[string]string{"badsel": "true"} })
	waitCondition(t, "badsel", v1alpha1.ConditionDegraded, metav1.ConditionFalse, ReasonAsExpected)
	poll.UntilNil(t, 30*time.Second, "observedGeneration follows a successful reconcile", func() error {
		svc := getService(t, "badsel")
		if svc.Status.ObservedGeneration != svc.Generation {
			return fmt.Errorf("observedGeneration %d, generation %d", svc.Status.ObservedGeneration, svc.Generation)
		}
		return nil
	})
}
