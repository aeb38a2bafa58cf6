//go:build e2e

// Package e2e installs RDMAvisor on a real cluster the way a user does (helm
// install, kubectl apply) and checks, step by step, what a user relies on:
// the operator, the agent DaemonSet, RDMANode and RDMAService status, the
// extended resource, pods exchanging messages over vconns, CNI registration,
// scheduling limits, recovery from a kubelet restart and an agent crash,
// and cleanup. hack/e2e.sh runs it on the local cluster
// (hack/local-cluster); it needs KUBECONFIG, HELM and KUBECTL.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
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
	t        *testing.T
	ctx      context.Context
	kube     *kubernetes.Clientset
	crs      client.Client
	repo     string
	helm     string
	kubectl  string
	node     string
	svc      *v1alpha1.RDMAService // the sample, as applied
	resource corev1.ResourceName
	capacity int64
}

func TestE2E(t *testing.T) {
	began := time.Now()
	e := setup(t)
	steps := []struct {
		name string
		fn   func(*env)
	}{
		{"helm install: the operator becomes ready", (*env).helmInstall},
		{"kubectl apply RDMAService: agent, RDMANode and service ready", (*env).applyService},
		{"the node advertises the vconn resource", (*env).allocatable},
		{"two pods exchange messages over vconns", (*env).echo},
		{"metrics: the agent counted the messages, the operator serves a reader only", (*env).metricsMoved},
		{"the CNI plugin registered both pods", (*env).cniRegistered},
		{"a pod asking more vconns than the node has stays Pending", (*env).overQuota},
		{"kubelet restart: the device plugin registers again", (*env).kubeletRestart},
		{"agent pod killed: recreated, devices healthy again", (*env).agentKilled},
		{"RDMAService deleted: agent, RDMANode and node resource gone", (*env).deleteService},
		{"ibverbs sample on a node without RDMA: the agent waits and says why", (*env).ibverbsWithoutDevice},
		{"helm uninstall leaves only the CRDs", (*env).helmUninstall},
	}
	for _, s := range steps {
		start := time.Now()
		if !t.Run(s.name, func(t *testing.T) {
			sub := *e
			sub.t = t
			s.fn(&sub)
		}) {
			e.dumpState()
			t.FailNow()
		}
		t.Logf("step %q took %s", s.name, time.Since(start).Round(time.Millisecond))
	}
	t.Logf("e2e suite took %s", time.Since(began).Round(time.Second))
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
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	crs, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	t.Cleanup(cancel)
	_, file, _, _ := runtime.Caller(0)
	e := &env{t: t, ctx: ctx, kube: kube, crs: crs, repo: filepath.Join(filepath.Dir(file), "..", ".."),
		helm: os.Getenv("HELM"), kubectl: os.Getenv("KUBECTL")}
	nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes.Items) != 1 {
		t.Fatalf("the suite expects a single-node cluster, found %d nodes", len(nodes.Items))
	}
	e.node = nodes.Items[0].Name
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
	return e
}

// run runs a command and returns its output; a failure fails the step.
func (e *env) run(name string, args ...string) string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(e.ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = e.repo
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		e.t.Fatalf("%s %s: %v\n%s", filepath.Base(name), strings.Join(args, " "), err, out.String())
	}
	return out.String()
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

func (e *env) helmInstall() {
	out := e.run(e.helm, "install", release, "charts/rdmavisor", "--namespace", namespace, "--create-namespace",
		"--set", "image.repository=local.test/rdmavisor", "--set", "image.tag=dev", "--set", "image.pullPolicy=Never")
	if !strings.Contains(out, "STATUS: deployed") {
		e.t.Fatalf("helm install: %s", out)
	}
	e.eventually("operator Deployment available", 3*time.Minute, func() (bool, string) {
		l, err := e.kube.AppsV1().Deployments(namespace).List(e.ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		if err != nil || len(l.Items) != 1 {
			return false, fmt.Sprintf("deployments: %v %v", l, err)
		}
		d := l.Items[0]
		return d.Status.AvailableReplicas == 1 && d.Status.ReadyReplicas == 1, fmt.Sprintf("%s: %+v", d.Name, d.Status)
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

// agentReady: the DaemonSet's one pod is ready, the node's RDMANode says
// Ready, and the RDMAService's Ready condition is True.
func (e *env) agentReady() (bool, string) {
	ds, err := e.daemonSet()
	if err != nil {
		return false, err.Error()
	}
	if s := ds.Status; s.DesiredNumberScheduled != 1 || s.NumberReady != 1 || s.UpdatedNumberScheduled != 1 {
		return false, fmt.Sprintf("DaemonSet status %+v", s)
	}
	var rn v1alpha1.RDMANode
	if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.node}, &rn); err != nil {
		return false, "RDMANode: " + err.Error()
	}
	if !meta.IsStatusConditionTrue(rn.Status.Conditions, v1alpha1.ConditionNodeReady) || rn.Spec.ServiceName != e.svc.Name {
		return false, fmt.Sprintf("RDMANode %+v", rn.Status)
	}
	var svc v1alpha1.RDMAService
	if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.svc.Name}, &svc); err != nil {
		return false, "RDMAService: " + err.Error()
	}
	if !meta.IsStatusConditionTrue(svc.Status.Conditions, v1alpha1.ConditionReady) || svc.Status.ReadyNodes != 1 {
		return false, fmt.Sprintf("RDMAService status %+v", svc.Status)
	}
	return true, ""
}

func (e *env) applyService() {
	e.run(e.kubectl, "apply", "-f", "config/samples/rdmavisor_v1alpha1_rdmaservice_soft.yaml")
	e.eventually("agent ready", 3*time.Minute, e.agentReady)
	var rn v1alpha1.RDMANode
	if err := e.crs.Get(e.ctx, client.ObjectKey{Name: e.node}, &rn); err != nil {
		e.t.Fatal(err)
	}
	st := rn.Status
	if st.VConnCapacity != int32(e.capacity) || st.Address == nil || st.Address.ControlPort == 0 ||
		len(st.Devices) != 1 || st.Devices[0].Provider != v1alpha1.ProviderSoft || st.Devices[0].Health != v1alpha1.DeviceHealthy {
		e.t.Fatalf("RDMANode status: %+v", st)
	}
}

// vconns reads the node's capacity and allocatable of the vconn resource
// (-1 when absent).
func (e *env) vconns() (capacity, allocatable int64) {
	n, err := e.kube.CoreV1().Nodes().Get(e.ctx, e.node, metav1.GetOptions{})
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

func (e *env) allocatableIs(want int64) func() (bool, string) {
	return func() (bool, string) {
		c, a := e.vconns()
		return a == want, fmt.Sprintf("%s: capacity %d, allocatable %d, want allocatable %d", e.resource, c, a, want)
	}
}

func (e *env) allocatable() {
	e.eventually("allocatable vconns", 2*time.Minute, e.allocatableIs(e.capacity))
}

// echoPod is a pod of the example program requesting vconns.
func (e *env) echoPod(name string, vconns int64, args ...string) *corev1.Pod {
	q := *resource.NewQuantity(vconns, resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: map[string]string{"app": "rdmavisor-e2e"}},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: new(int64(2)),
			Containers: []corev1.Container{{
				Name: "echo", Image: echoImage, ImagePullPolicy: corev1.PullNever, Args: args,
				Env: []corev1.EnvVar{{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
					FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}}},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{e.resource: q}},
				SecurityContext: &corev1.SecurityContext{RunAsNonRoot: new(true),
					AllowPrivilegeEscalation: new(false), ReadOnlyRootFilesystem: new(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
		},
	}
}

func (e *env) createPod(p *corev1.Pod) {
	if _, err := e.kube.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) deletePod(name string) {
	err := e.kube.CoreV1().Pods("default").Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(1))})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Fatal(err)
	}
	e.eventually("pod "+name+" gone", 2*time.Minute, func() (bool, string) {
		_, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

func (e *env) logs(name string) string {
	b, err := e.kube.CoreV1().Pods("default").GetLogs(name, &corev1.PodLogOptions{}).DoRaw(e.ctx)
	if err != nil {
		return err.Error()
	}
	return string(b)
}

var okLine = regexp.MustCompile(`echo: OK (\d+) vconns, (\d+) messages of (\d+) bytes checked`)

// exchange runs a client pod against the echo server and waits for its
// verdict: 2 vconns, every byte of 1,000 messages of 4 KiB checked.
func (e *env) exchange(client string) {
	e.createPod(e.echoPod(client, 2, "client", fmt.Sprintf("--addr=$(NODE_NAME):%d", echoPort),
		"--conns=2", "--messages=500", "--size=4096", "--timeout=90s", "--hold"))
	e.eventually("client "+client+" checked every byte", 2*time.Minute, func() (bool, string) {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, client, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if p.Status.Phase == corev1.PodFailed {
			e.t.Fatalf("client failed: %s", e.logs(client))
		}
		m := okLine.FindStringSubmatch(e.logs(client))
		return m != nil && m[1] == "2" && m[2] == "1000" && m[3] == "4096", fmt.Sprintf("phase %s, logs %q", p.Status.Phase, e.logs(client))
	})
	e.t.Log(strings.TrimSpace(e.logs(client)))
}

func (e *env) startServer() {
	e.createPod(e.echoPod("echo-server", 2, "server", fmt.Sprintf("--port=%d", echoPort)))
	e.eventually("echo server listening", 2*time.Minute, func() (bool, string) {
		l := e.logs("echo-server")
		return strings.Contains(l, "listening on"), l
	})
}

// startServerAfterRestart starts the echo server as a controller would
// just after the device plugin restarted. The node status that
// allocatableIs reads can lag the kubelet's device manager: it may still
// show the old plugin's healthy devices while the new plugin's are not
// yet, and the kubelet then refuses the pod (UnexpectedAdmissionError,
// final for a bare pod; seen once in CI). Such a pod is made again, up to
// three times, and each refusal is logged.
func (e *env) startServerAfterRestart() {
	for try := 1; ; try++ {
		e.createPod(e.echoPod("echo-server", 2, "server", fmt.Sprintf("--port=%d", echoPort)))
		refused := ""
		e.eventually("echo server listening", 2*time.Minute, func() (bool, string) {
			p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "echo-server", metav1.GetOptions{})
			if err == nil && p.Status.Phase == corev1.PodFailed && p.Status.Reason == "UnexpectedAdmissionError" {
				refused = p.Status.Message
				return true, ""
			}
			l := e.logs("echo-server")
			return strings.Contains(l, "listening on"), l
		})
		if refused == "" {
			return
		}
		e.t.Logf("echo server refused admission (try %d): %s", try, refused)
		if try == 3 {
			e.t.Fatalf("echo server refused admission %d times: %s", try, refused)
		}
		e.deletePod("echo-server")
	}
}

func (e *env) echo() {
	e.startServer()
	e.exchange("echo-client")
	// Each pod got an allocation of its two vconns from the device plugin.
	var allocs []struct {
		ID     string
		VConns int
	}
	e.agentState("allocations", &allocs)
	if len(allocs) != 2 || allocs[0].VConns != 2 || allocs[1].VConns != 2 {
		e.t.Fatalf("agent allocations: %+v", allocs)
	}
}

// agentState runs `rdmavisor agent WHAT` in the agent container.
func (e *env) agentState(what string, v any) {
	e.t.Helper()
	pods := e.agentPods()
	if len(pods) != 1 {
		e.t.Fatalf("%d agent pods", len(pods))
	}
	out := e.run(e.kubectl, "exec", "-n", namespace, pods[0].Name, "-c", "agent", "--", "rdmavisor", "agent", what)
	if err := json.Unmarshal([]byte(out), v); err != nil {
		e.t.Fatalf("rdmavisor agent %s: %v\n%s", what, err, out)
	}
}

type agentPod struct {
	UID, Namespace, Name string
	IPs                  []string
}

func (e *env) registered() map[string]agentPod {
	var pods []agentPod
	e.agentState("pods", &pods)
	m := make(map[string]agentPod, len(pods))
	for _, p := range pods {
		m[p.UID] = p
	}
	return m
}

// hostCNI checks, where the suite runs on the node itself (hack/e2e.sh
// sets E2E_CNI_CONF_DIR and E2E_CNI_BIN_DIR), whether the plugin is in
// the node's CNI configuration and binary directory.
func (e *env) hostCNI(want bool) {
	e.t.Helper()
	confDir, binDir := os.Getenv("E2E_CNI_CONF_DIR"), os.Getenv("E2E_CNI_BIN_DIR")
	if confDir == "" || binDir == "" {
		e.t.Log("E2E_CNI_CONF_DIR or E2E_CNI_BIN_DIR unset: not checking the node's CNI files")
		return
	}
	e.eventually(fmt.Sprintf("rdmavisor-cni installed on the node: %v", want), time.Minute, func() (bool, string) {
		files, _ := filepath.Glob(filepath.Join(confDir, "*.conflist"))
		chained := false
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err == nil && strings.Contains(string(b), `"rdmavisor-cni"`) {
				chained = true
			}
		}
		_, err := os.Stat(filepath.Join(binDir, "rdmavisor-cni"))
		return chained == want && (err == nil) == want, fmt.Sprintf("chained %v, binary %v", chained, err)
	})
}

func (e *env) cniRegistered() {
	e.hostCNI(true)
	reg := e.registered()
	for _, name := range []string{"echo-server", "echo-client"} {
		p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		r, ok := reg[string(p.UID)]
		if !ok || r.Name != name || r.Namespace != "default" || len(r.IPs) == 0 || r.IPs[0] != p.Status.PodIP {
			e.t.Fatalf("pod %s (uid %s, IP %s): agent has %+v (all: %+v)", name, p.UID, p.Status.PodIP, r, reg)
		}
	}
	// CNI DEL unregisters a pod that goes.
	client, err := e.kube.CoreV1().Pods("default").Get(e.ctx, "echo-client", metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.deletePod("echo-client")
	e.eventually("client unregistered", time.Minute, func() (bool, string) {
		_, ok := e.registered()[string(client.UID)]
		return !ok, "still registered"
	})
}

func (e *env) overQuota() {
	e.createPod(e.echoPod("too-many", e.capacity+1, "server"))
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

// registrations counts the device plugin's registrations with the kubelet.
func (e *env) registrations() int {
	pods := e.agentPods()
	if len(pods) != 1 {
		return -1
	}
	out, err := e.kube.CoreV1().Pods(namespace).GetLogs(pods[0].Name, &corev1.PodLogOptions{Container: "device-plugin"}).DoRaw(e.ctx)
	if err != nil {
		return -1
	}
	return strings.Count(string(out), "Registered with the kubelet")
}

func (e *env) kubeletRestart() {
	before := e.registrations()
	if before < 1 {
		e.t.Fatalf("device plugin registrations before the restart: %d", before)
	}
	restart := os.Getenv("E2E_RESTART_KUBELET")
	if restart == "" {
		restart = "hack/local-cluster/up.sh --restart kubelet"
	}
	e.run("bash", "-c", restart)
	e.eventually("device plugin registered again", 2*time.Minute, func() (bool, string) {
		n := e.registrations()
		return n > before, fmt.Sprintf("%d registrations (before the restart: %d)", n, before)
	})
	e.eventually("allocatable back", 2*time.Minute, e.allocatableIs(e.capacity))
	// The new kubelet admits and allocates: a new client gets its vconns.
	e.exchange("echo-client-2")
	e.deletePod("echo-client-2")
}

func (e *env) agentKilled() {
	old := e.agentPods()
	if len(old) != 1 {
		e.t.Fatalf("%d agent pods", len(old))
	}
	err := e.kube.CoreV1().Pods(namespace).Delete(e.ctx, old[0].Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))})
	if err != nil {
		e.t.Fatal(err)
	}
	e.eventually("a new agent pod ready", 3*time.Minute, func() (bool, string) {
		pods := e.agentPods()
		if len(pods) != 1 || pods[0].UID == old[0].UID {
			return false, fmt.Sprintf("%d agent pods", len(pods))
		}
		ok, why := e.agentReady()
		return ok, why
	})
	e.eventually("devices healthy: allocatable back", 2*time.Minute, e.allocatableIs(e.capacity))
	// The old server's agent is gone; a new pair talks through the new one.
	e.deletePod("echo-server")
	e.startServerAfterRestart()
	e.exchange("echo-client-3")
	for _, p := range []string{"echo-client-3", "echo-server"} {
		e.deletePod(p)
	}
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
	// With its plugin gone the kubelet offers no vconn: nothing more can
	// be scheduled against it. (The kubelet zeroes the capacity itself
	// five minutes later.)
	e.eventually("no allocatable vconns", 2*time.Minute, func() (bool, string) {
		c, a := e.vconns()
		return a <= 0, fmt.Sprintf("capacity %d, allocatable %d", c, a)
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
	for _, p := range e.agentPods() {
		for _, c := range []string{"agent", "device-plugin"} {
			b, _ := e.kube.CoreV1().Pods(namespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: c, TailLines: new(int64(40))}).DoRaw(context.Background())
			e.t.Logf("%s/%s logs:\n%s", p.Name, c, b)
		}
	}
}
