//go:build e2e

// Package e2e installs RDMAvisor on a real cluster the way a user does (helm
// install, kubectl apply) and checks, step by step, what a user relies on:
// an upgrade from the previous release mid-traffic (upgrade_test.go), the
// operator, the agent DaemonSet, RDMANode and RDMAService status, the
// extended resource, pods on different nodes exchanging messages over
// vconns, CNI registration, scheduling limits, an allocation's limits and
// send rate (spec.limits), recovery from a kubelet
// restart and an agent crash, and cleanup. hack/e2e.sh runs it on the
// local cluster (hack/local-cluster, three nodes by default); it needs
// KUBECONFIG, HELM and KUBECTL, and at least two nodes.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
)

const (
	namespace = "rdmavisor-system"
	release   = "rdmavisor"
	agentApp  = "rdmavisor-agent"
	echoImage = "local.test/rdmavisor-echo:dev"
	echoPort  = 7000
)

// env is what the suite shares between its steps.
type env struct {
	t        *stepT
	ctx      context.Context
	kube     *kubernetes.Clientset
	crs      client.Client
	repo     string
	helm     string
	kubectl  string
	nodes    []string              // by name, sorted: the first runs the control plane
	svc      *v1alpha1.RDMAService // the sample, as applied
	resource corev1.ResourceName
	capacity int64
	results  *results // shared by every step's copy of env
	scraper  *scraper // the suite's Prometheus, shared as results is
}

func TestE2E(t *testing.T) {
	began := time.Now()
	e := setup(t)
	steps := []struct {
		name string
		fn   func(*env)
	}{
		{"helm install of the previous release: the operator becomes ready", (*env).helmInstallPrevious},
		{"kubectl apply RDMAService with no agent image: the previous release's agents ready", (*env).applyPreviousService},
		{"helm upgrade to this release mid-traffic: old and new agents exchange every byte both ways, nothing lost unannounced, the old pods work with the new agents", (*env).upgradeFromPrevious},
		{"kubectl apply RDMAService: agent, RDMANode and service ready", (*env).applyService},
		{"the node advertises the vconn resource", (*env).allocatable},
		{"two pods on different nodes exchange messages over vconns", (*env).echo},
		{"metrics: both agents counted the messages, the operator serves a reader only", (*env).metricsMoved},
		{"kubectl rdmavisor: status shows every node Ready, pods and top the echo pods' bytes, diagnose of the echo client all OK", (*env).kubectlPlugin},
		{"the CNI plugin registered each pod with its own node's agent; a deleted pod unregistered, its allocation released", (*env).cniRegistered},
		{"NetworkPolicy on vconns: deny-all ingress refuses a client of another namespace, naming the policy; an allow rule admits it, every byte checked", (*env).netPolicy},
		{"a rogue node announces a live pod's IP and 65,535 more through a rolling agent restart: no dial reaches it, every delivered byte echoed by the real server, both other nodes' clients succeed after", (*env).rogueAnnouncer},
		{"DRA: each node's ResourceSlice; a claim's pod and a DRA extended resource's pod echo across nodes with exactly their quota; a pod the agent cannot back (Both) refused at admission, the agent's reason in a Warning Event; deleted, their allocations released", (*env).dra},
		{"1,000 vconns across nodes over auto, every byte checked; QP pools stay at qpsPerPeer", func(e *env) { e.thousandVConns("auto") }},
		{"each agent serves a certificate the operator issued for its own node", (*env).nodeCertificates},
		{"a link losing and reordering 5% of packets: every message once, in order", (*env).lossyLink},
		{"a gRPC client calls servers on other nodes by a headless Service's name", (*env).grpcEcho},
		{"the echo example in C and Python: C server and Go client, Go server and Python client, Python server and C client, across nodes", (*env).languages},
		{"every agent's certificate renewed mid-traffic: nothing lost, new certificates served", (*env).certRotation},
		{"the operator's leader deleted mid-traffic: the vconns carry on, the other replica takes the lease", (*env).operatorRestart},
		{"the operator leader's node lost: its peers' vconns fail within 5s, their QPs released, the other replica takes the lease and reports it, traffic between the other nodes loses nothing; back, it serves again", (*env).nodeLost},
		{"a pod asking more vconns than any node has stays Pending", (*env).overQuota},
		{"kubelet restart: the device plugin registers again, and releases a deleted pod's allocation", (*env).kubeletRestart},
		{"agent pod killed: recreated, devices healthy again", (*env).agentKilled},
		{"spec.limits patched: a second listen refused past listeners 1; a burst past messageRate all arrives, slowed", (*env).limits},
		{"helm upgrade changes the transport to rc: the agents roll one node at a time", func(e *env) { e.rollTo("rc") }},
		{"1,000 vconns across nodes over rc, every byte checked; QP pools stay at qpsPerPeer; the echo pods gone, no agent holds an allocation", func(e *env) {
			e.thousandVConns("rc")
			e.deletePod("echo-server")
			for _, n := range e.nodes {
				e.allocationsBackTo(n, nil)
			}
		}},
		{"RDMAService deleted: agent, RDMANode and node resource gone", (*env).deleteService},
		{"ibverbs sample on a node without RDMA: the agent waits and says why", (*env).ibverbsWithoutDevice},
		{"helm uninstall leaves only the CRDs", (*env).helmUninstall},
		{"the README's quick start, as written: install, echo by Service name, DRA echo, uninstall", (*env).quickstart},
	}
	for _, s := range steps {
		start := time.Now()
		e.step(s.name, s.fn)
		t.Logf("step %q took %s", s.name, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("e2e suite took %s", time.Since(began).Round(time.Second))
	if path := os.Getenv("E2E_RESULTS"); path != "" && !t.Failed() {
		if err := e.results.write(path, e.repo, len(e.nodes), time.Since(began)); err != nil {
			t.Error(err)
		}
		t.Logf("wrote the measured figures to %s", path)
	}
}

func setup(t *testing.T) *env {
	for _, v := range []string{"KUBECONFIG", "HELM", "KUBECTL"} {
		if os.Getenv(v) == "" {
			t.Fatalf("%s is not set: run the suite with hack/e2e.sh", v)
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	if err != nil {
		t.Fatal(err)
	}
	// The upgrade's exchanges read the pods before and after each one, six
	// at once: client-go's default of 5 requests a second would space those
	// readings seconds apart.
	cfg.QPS, cfg.Burst = 50, 100
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crs, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 38*time.Minute)
	t.Cleanup(cancel)
	_, file, _, _ := runtime.Caller(0)
	e := &env{t: &stepT{T: t}, ctx: ctx, kube: kube, crs: crs, repo: filepath.Join(filepath.Dir(file), "..", ".."),
		helm: os.Getenv("HELM"), kubectl: os.Getenv("KUBECTL"), results: &results{}, scraper: &scraper{}}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) < 2 {
		t.Fatalf("the suite needs at least two nodes (vconns between nodes), found %d", len(nodes.Items))
	}
	for _, n := range nodes.Items {
		e.nodes = append(e.nodes, n.Name)
	}
	slices.Sort(e.nodes)
	data, err := os.ReadFile(filepath.Join(e.repo, "config", "samples", "rdmavisor_v1alpha1_rdmaservice_soft.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	e.svc = &v1alpha1.RDMAService{}
	if err := yaml.UnmarshalStrict(data, e.svc); err != nil {
		t.Fatal(err)
	}
	e.resource = corev1.ResourceName(e.svc.Spec.ResourceName)
	if e.svc.Spec.VConnsPerNode == nil || e.resource == "" {
		t.Fatal("the soft sample must set vconnsPerNode and resourceName")
	}
	e.capacity = int64(*e.svc.Spec.VConnsPerNode)
	// The device plugin and the DRA driver both: every step but dra takes
	// its vconns from the device plugin, beside the driver.
	e.svc.Spec.Allocation = v1alpha1.AllocationBoth
	return e
}

// run runs a command and returns its output; a failure fails the step.
func (e *env) run(name string, args ...string) string {
	e.t.Helper()
	out, err := e.tryRun(name, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// tryRun is run for a step that waits: its error says the command and
// what it printed.
func (e *env) tryRun(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = e.repo
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// eventually polls cond until it holds, or fails the step with what it
// last said.
func (e *env) eventually(what string, timeout time.Duration, cond func() (bool, string)) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, why := cond()
		if ok {
			return
		}
		last = why
		if time.Now().After(deadline) || e.ctx.Err() != nil {
			e.t.Fatalf("%s: not within %s: %s", what, timeout, last)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func (e *env) helmInstall() { e.helmInstallChart("charts/rdmavisor", "dev") }

// helmInstallChart installs chart with the images of tag.
func (e *env) helmInstallChart(chart, tag string) {
	out := e.run(e.helm, "install", release, chart, "--namespace", namespace, "--create-namespace",
		"--set", "image.repository=local.test/rdmavisor", "--set", "image.tag="+tag, "--set", "image.pullPolicy=Never",
		"--set", "dra.deviceClass.enabled=true", "--set", "dra.deviceClass.extendedResourceName="+draResource)
	if !strings.Contains(out, "STATUS: deployed") {
		e.t.Fatalf("helm install: %s", out)
	}
	e.eventually("operator Deployment available", 3*time.Minute, func() (bool, string) {
		l, err := e.kube.AppsV1().Deployments(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		if err != nil || len(l.Items) != 1 {
			return false, fmt.Sprintf("deployments: %v %v", l, err)
		}
		d := l.Items[0]
		return d.Status.AvailableReplicas == 2 && d.Status.ReadyReplicas == 2, fmt.Sprintf("%s: %+v", d.Name, d.Status)
	})
}

func (e *env) agentPods() []corev1.Pod {
	l, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=" + agentApp})
	if err != nil {
		e.t.Fatal(err)
	}
	return l.Items
}

func (e *env) daemonSet() (*appsv1.DaemonSet, error) {
	return e.kube.AppsV1().DaemonSets(namespace).Get(e.ctx, "rdmavisor-agent-"+e.svc.Name, metav1.GetOptions{})
}

// agentReady: the DaemonSet has a ready, updated pod on every node, every
// node's RDMANode says Ready, and the RDMAService's Ready condition is True
// with every node ready.
func (e *env) agentReady() (bool, string) {
	ds, err := e.daemonSet()
	if err != nil {
		return false, err.Error()
	}
	n := int32(len(e.nodes))
	if s := ds.Status; s.DesiredNumberScheduled != n || s.NumberReady != n || s.UpdatedNumberScheduled != n ||
		s.ObservedGeneration != ds.Generation {
		return false, fmt.Sprintf("DaemonSet status %+v", s)
	}
	for _, node := range e.nodes {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: node}, &rn); err != nil {
			return false, "RDMANode: " + err.Error()
		}
		if !meta.IsStatusConditionTrue(rn.Status.Conditions, v1alpha1.ConditionNodeReady) || rn.Spec.ServiceName != e.svc.Name {
			return false, fmt.Sprintf("RDMANode %s %+v", node, rn.Status)
		}
	}
	var svc v1alpha1.RDMAService
	if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.svc.Name}, &svc); err != nil {
		return false, "RDMAService: " + err.Error()
	}
	if !meta.IsStatusConditionTrue(svc.Status.Conditions, v1alpha1.ConditionReady) || svc.Status.ReadyNodes != n {
		return false, fmt.Sprintf("RDMAService status %+v", svc.Status)
	}
	return true, ""
}

func (e *env) applyService() {
	// The sample, with allocation Both.
	e.applyRDMAService(e.svc)
	for _, node := range e.nodes {
		var rn v1alpha1.RDMANode
		if err := e.crs.Get(e.ctx, client.ObjectKey{Name: node}, &rn); err != nil {
			e.t.Fatal(err)
		}
		st := rn.Status
		if st.VConnCapacity != int32(e.capacity) || st.Address == nil || st.Address.ControlPort == 0 ||
			len(st.Devices) != 1 || st.Devices[0].Provider != v1alpha1.ProviderSoft || st.Devices[0].Health != v1alpha1.DeviceHealthy {
			e.t.Fatalf("RDMANode %s status: %+v", node, st)
		}
	}
}

// applyRDMAService applies svc with kubectl and waits for its agents.
func (e *env) applyRDMAService(svc *v1alpha1.RDMAService) {
	data, err := yaml.Marshal(svc)
	if err != nil {
		e.t.Fatal(err)
	}
	// Not in t.TempDir(): kubectl splits -f at the commas of its name.
	f, err := os.CreateTemp("", "rdmaservice-*.yaml")
	if err != nil {
		e.t.Fatal(err)
	}
	file := f.Name()
	e.t.Cleanup(func() { _ = os.Remove(file) })
	if _, err := f.Write(data); err != nil || f.Close() != nil {
		e.t.Fatal(err)
	}
	e.run(e.kubectl, "apply", "-f", file)
	e.eventually("agents ready on every node", 3*time.Minute, e.agentReady)
}

// vconns reads a node's capacity and allocatable of the vconn resource
// (-1 when absent).
func (e *env) vconns(node string) (capacity, allocatable int64) {
	n, err := e.kube.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	capacity, allocatable = -1, -1
	if q, ok := n.Status.Capacity[e.resource]; ok {
		capacity = q.Value()
	}
	if q, ok := n.Status.Allocatable[e.resource]; ok {
		allocatable = q.Value()
	}
	return capacity, allocatable
}

// allocatableIs: every node in nodes (all when none is named) offers want.
func (e *env) allocatableIs(want int64, nodes ...string) func() (bool, string) {
	if len(nodes) == 0 {
		nodes = e.nodes
	}
	return func() (bool, string) {
		for _, n := range nodes {
			if c, a := e.vconns(n); a != want {
				return false, fmt.Sprintf("%s on %s: capacity %d, allocatable %d, want allocatable %d", e.resource, n, c, a, want)
			}
		}
		return true, ""
	}
}

func (e *env) allocatable() {
	e.eventually("allocatable vconns on every node", 2*time.Minute, e.allocatableIs(e.capacity))
}

func (e *env) echo() {
	e.startServer()
	e.exchange("echo-client", e.clientNode(), defaultLoad)
	// Each pod got an allocation of its vconns from its own node's device
	// plugin; the third node's agent holds none.
	want := map[string][]allocation{e.clientNode(): {{VConns: defaultLoad.conns}}, e.serverNode(): {{VConns: serverVConns}}}
	for _, node := range e.nodes {
		got := e.allocations(node)
		if len(got) != len(want[node]) || (len(got) == 1 && got[0].VConns != want[node][0].VConns) {
			e.t.Fatalf("allocations of the agent on %s: %+v, want %+v", node, got, want[node])
		}
	}
	e.columnsMatchAgents(defaultLoad.conns + serverVConns)
	// kubectl describe shows the pod's allocation (its environment,
	// filled by the device plugin, shows nothing).
	e.eventually("the server pod's Event of its allocation in kubectl describe", time.Minute, func() (bool, string) {
		out, err := e.tryRun(e.kubectl, "describe", "pod", "echo-server", "-n", "default")
		want := fmt.Sprintf("%d vconns allocated by the RDMAvisor agent on %s", serverVConns, e.serverNode())
		return err == nil && strings.Contains(out, "VConnsAllocated") && strings.Contains(out, want), out
	})
}

// agentPod is the agent's pod on node.
func (e *env) agentPod(node string) corev1.Pod {
	e.t.Helper()
	var on []corev1.Pod
	for _, p := range e.agentPods() {
		if p.Spec.NodeName == node && p.DeletionTimestamp == nil {
			on = append(on, p)
		}
	}
	if len(on) != 1 {
		e.t.Fatalf("%d agent pods on %s", len(on), node)
	}
	return on[0]
}

// agentState runs `rdmavisor agent WHAT` in the agent container on node.
func (e *env) agentState(node, what string, v any) {
	e.t.Helper()
	pod := e.agentPod(node)
	out := e.run(e.kubectl, "exec", "-n", namespace, pod.Name, "-c", "agent", "--", "rdmavisor", "agent", what)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("rdmavisor agent %s: %v\n%s", what, err, out)
	}
}

type agentPod struct {
	UID, Namespace, Name string
	IPs                  []string
}

func (e *env) registered(node string) map[string]agentPod {
	var pods []agentPod
	e.agentState(node, "pods", &pods)
	m := make(map[string]agentPod, len(pods))
	for _, p := range pods {
		m[p.UID] = p
	}
	return m
}

func (e *env) overQuota() {
	e.createPod(e.echoPod("too-many", "", e.capacity+1, "server"))
	e.eventually("too-many unschedulable", time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "too-many", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
				strings.Contains(c.Message, "Insufficient "+string(e.resource)) {
				return p.Status.Phase == corev1.PodPending, fmt.Sprintf("phase %s", p.Status.Phase)
			}
		}
		return false, fmt.Sprintf("phase %s, conditions %+v", p.Status.Phase, p.Status.Conditions)
	})
	// It stays Pending: the scheduler does not change its mind.
	time.Sleep(3 * time.Second)
	p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "too-many", metav1.GetOptions{})
	if err != nil || p.Status.Phase != corev1.PodPending || p.Spec.NodeName != "" {
		e.t.Fatalf("too-many: %v %+v", err, p.Status)
	}
	e.deletePod("too-many")
}

func (e *env) deleteService() {
	e.run(e.kubectl, "delete", "rdmaservice", e.svc.Name, "--wait=true", "--timeout=2m")
	e.eventually("agent objects gone", 2*time.Minute, func() (bool, string) {
		if _, err := e.daemonSet(); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("DaemonSet: %v", err)
		}
		if pods := e.agentPods(); len(pods) != 0 {
			return false, fmt.Sprintf("%d agent pods", len(pods))
		}
		var rns v1alpha1.RDMANodeList
		if err := e.crs.List(e.ctx, &rns); err != nil || len(rns.Items) != 0 {
			return false, fmt.Sprintf("RDMANodes: %d %v", len(rns.Items), err)
		}
		name := "rdmavisor-agent-" + e.svc.Name
		if _, err := e.kube.CoreV1().ConfigMaps(namespace).Get(e.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("ConfigMap: %v", err)
		}
		if _, err := e.kube.RbacV1().ClusterRoles().Get(e.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			return false, fmt.Sprintf("ClusterRole: %v", err)
		}
		return true, ""
	})
	// The agent's CNI sidecar took the plugin out of the node's chain.
	e.hostCNI(false)
	// The kubelets wipe the slices of a driver that stays unregistered.
	e.eventually("no ResourceSlices of the DRA driver", 3*time.Minute, e.noSlices)
	// With its plugin gone the kubelet offers no vconn: nothing more can
	// be scheduled against it. (The kubelet zeroes the capacity itself
	// five minutes later.)
	e.eventually("no allocatable vconns", 2*time.Minute, func() (bool, string) {
		for _, n := range e.nodes {
			if c, a := e.vconns(n); a > 0 {
				return false, fmt.Sprintf("%s: capacity %d, allocatable %d", n, c, a)
			}
		}
		return true, ""
	})
}

func (e *env) helmUninstall() {
	e.run(e.helm, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "2m")
	e.eventually("release objects gone", 2*time.Minute, func() (bool, string) {
		sel := metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release}
		d, err := e.kube.AppsV1().Deployments(namespace).List(e.ctx, sel)
		if err != nil || len(d.Items) != 0 {
			return false, fmt.Sprintf("deployments %v", err)
		}
		p, err := e.kube.CoreV1().Pods(namespace).List(e.ctx, metav1.ListOptions{})
		if err != nil || len(p.Items) != 0 {
			return false, fmt.Sprintf("pods in %s: %d %v", namespace, len(p.Items), err)
		}
		for _, kind := range []string{"clusterroles", "clusterrolebindings"} {
			out := e.run(e.kubectl, "get", kind, "-l", "app.kubernetes.io/instance="+release, "-o", "name")
			if strings.TrimSpace(out) != "" {
				return false, kind + ": " + out
			}
		}
		sa, err := e.kube.CoreV1().ServiceAccounts(namespace).List(e.ctx, sel)
		if err != nil || len(sa.Items) != 0 {
			return false, fmt.Sprintf("service accounts %v", err)
		}
		return true, ""
	})
	// Helm keeps CRDs (and so the users' custom resources) on uninstall.
	for _, crd := range []string{"rdmaservices.rdmavisor.io", "rdmanodes.rdmavisor.io"} {
		e.run(e.kubectl, "get", "crd", crd)
	}
}

// dumpState logs what a failed step leaves, for the CI log.
func (e *env) dumpState() {
	cmd := exec.Command(e.kubectl, "get", "pods,daemonsets,deployments,rdmaservices,rdmanodes", "-A", "-o", "wide")
	out, _ := cmd.CombinedOutput()
	e.t.Logf("cluster state:\n%s", out)
	out, _ = exec.Command(e.kubectl, "get", "rdmaservices,rdmanodes", "-o", "yaml").CombinedOutput()
	e.t.Logf("RDMAServices and RDMANodes:\n%s", out)
	out, _ = exec.Command(e.kubectl, "logs", "-n", namespace, "-l", "app.kubernetes.io/component=operator", "--tail=40").CombinedOutput()
	e.t.Logf("operator logs:\n%s", out)
	for _, p := range e.agentPods() {
		for _, c := range []string{"agent", "device-plugin", "dra-driver"} {
			b, _ := e.kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c, TailLines: new(int64(40))}).DoRaw(context.Background())
			e.t.Logf("%s/%s logs:\n%s", p.Name, c, b)
		}
		// A container that restarted: how its last run ended, in its words.
		for _, cs := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			if t := cs.LastTerminationState.Terminated; t != nil {
				b, _ := e.kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: cs.Name, Previous: true, TailLines: new(int64(40))}).DoRaw(context.Background())
				e.t.Logf("%s/%s restarted %d times; the last run ended %s (exit %d) at %s:\n%s", p.Name, cs.Name, cs.RestartCount,
					t.Reason, t.ExitCode, t.FinishedAt.Format(time.RFC3339), b)
			}
		}
	}
}
