package controllers

import (
	"context"
	"fmt"
	"hash/fnv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// The suite runs one API server and one manager; tests are sequential and
// keep apart by their own node labels and service names.
const (
	testNamespace = "rdmavisor-system"
	testImage     = "example.test/rdmavisor:v1"
)

var (
	testEnv  *envtest.Environment
	restCfg  *rest.Config
	k8s      client.Client // uncached, as an administrator
	rec      *RDMAServiceReconciler
	mgrCache client.Reader
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	// RDMAVISOR_TEST_LOG=1 shows the operator's log.
	if os.Getenv("RDMAVISOR_TEST_LOG") != "" {
		ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr)))
	} else {
		ctrl.SetLogger(logr.Discard())
	}
	var err error
	testEnv, restCfg, err = testenv.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	defer func() {
		if err := testEnv.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping envtest:", err)
		}
	}()
	if k8s, err = client.New(restCfg, client.Options{Scheme: testenv.Scheme()}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: creating client:", err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testNamespace}}); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: creating namespace:", err)
		return 1
	}
	if err := installStatic(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	// The operator runs with the RBAC generated from its markers, so every
	// test also checks that the role grants all the operator does.
	operatorCfg, err := operatorConfig(ctx)
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL:", err)
		return 1
	}
	mgr, err := ctrl.NewManager(operatorCfg, ctrl.Options{
		Scheme:                 testenv.Scheme(),
		Cache:                  CacheOptions(testNamespace),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: creating manager:", err)
		return 1
	}
	rec = New(mgr.GetClient(), testNamespace, testImage)
	rec.Recorder = mgr.GetEventRecorder(EventSource)
	if err := rec.SetupWithManager(ctx, mgr); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: setting up the controller:", err)
		return 1
	}
	signer := &CertSigner{Client: mgr.GetClient(), API: mgr.GetAPIReader(), Namespace: testNamespace}
	if err := signer.SetupWithManager(mgr); err != nil {
		fmt.Fprintln(os.Stderr, "FAIL: setting up the signer:", err)
		return 1
	}
	mgrCache = mgr.GetCache()
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	code := m.Run()
	cancel()
	if err := <-done; err != nil {
		fmt.Fprintln(os.Stderr, "manager:", err)
		code = 1
	}
	return code
}

// The test operator runs as the service account the chart gives it.
const (
	operatorSA   = "rdmavisor-operator"
	operatorUser = "system:serviceaccount:" + testNamespace + ":" + operatorSA
)

// installStatic creates what the chart installs once for every RDMAService
// (static.go): the agents' ClusterRole and the admission policies.
func installStatic(ctx context.Context) error {
	agentPolicy, agentBinding := NewAgentPolicy(testNamespace)
	opPolicy, opBinding := NewOperatorBindingsPolicy(testNamespace, operatorUser)
	slicePolicy, sliceBinding := NewAgentSlicePolicy(testNamespace)
	for _, o := range []client.Object{NewAgentClusterRole(), agentPolicy, agentBinding, opPolicy, opBinding, slicePolicy, sliceBinding} {
		if err := k8s.Create(ctx, o); err != nil {
			return fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
		}
	}
	return nil
}

// operatorConfig binds config/rbac/role.yaml to the operator's service
// account and returns a rest config that impersonates it.
func operatorConfig(ctx context.Context) (*rest.Config, error) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "rbac", "role.yaml"))
	if err != nil {
		return nil, err
	}
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: operatorSA, Namespace: testNamespace}
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.TrimSpace(strings.Trim(doc, "-\n")) == "" {
			continue
		}
		var kind struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &kind); err != nil {
			return nil, fmt.Errorf("reading role.yaml: %w", err)
		}
		var role, binding client.Object
		switch kind.Kind {
		case "ClusterRole":
			cr := &rbacv1.ClusterRole{}
			role = cr
			binding = &rbacv1.ClusterRoleBinding{Subjects: []rbacv1.Subject{subject},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole"}}
		case "Role":
			role = &rbacv1.Role{}
			binding = &rbacv1.RoleBinding{Subjects: []rbacv1.Subject{subject},
				RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role"}}
		default:
			return nil, fmt.Errorf("unexpected %q in role.yaml", kind.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), role); err != nil {
			return nil, fmt.Errorf("reading role.yaml: %w", err)
		}
		binding.SetName(role.GetName())
		binding.SetNamespace(role.GetNamespace())
		switch b := binding.(type) {
		case *rbacv1.ClusterRoleBinding:
			b.RoleRef.Name = role.GetName()
		case *rbacv1.RoleBinding:
			b.RoleRef.Name = role.GetName()
		}
		for _, o := range []client.Object{role, binding} {
			if err := k8s.Create(ctx, o); err != nil {
				return nil, fmt.Errorf("creating %T %s: %w", o, o.GetName(), err)
			}
		}
	}
	return operatorRestConfig(), nil
}

// operatorRestConfig impersonates the operator's service account.
func operatorRestConfig() *rest.Config {
	cfg := rest.CopyConfig(restCfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: operatorUser,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + testNamespace, "system:authenticated"}}
	return cfg
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func ptr[T any](v T) *T { return &v }

// createNodes creates Node objects (envtest runs no kubelet: they are only
// API objects) with labels, and deletes them when the test ends.
func createNodes(t *testing.T, labels map[string]string, names ...string) {
	t.Helper()
	for _, n := range names {
		createNode(t, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: labels}})
	}
}

// createNode creates node with the taints it asks for. The API server taints
// every new node not-ready (TaintNodesByCondition) until the node lifecycle
// controller, absent here, sees its kubelet ready: the test plays that part.
func createNode(t *testing.T, node *corev1.Node) {
	t.Helper()
	taints := node.Spec.Taints
	if err := k8s.Create(testCtx(t), node); err != nil {
		t.Fatalf("creating node %s: %v", node.Name, err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), node) })
	node.Spec.Taints = taints
	if err := k8s.Update(testCtx(t), node); err != nil {
		t.Fatalf("untainting node %s: %v", node.Name, err)
	}
}

// newService returns a soft-provider service that selects nodes labelled
// key=true.
func newService(name, key string) *v1alpha1.RDMAService {
	return &v1alpha1.RDMAService{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: v1alpha1.RDMAServiceSpec{
			NodeSelector:  &metav1.LabelSelector{MatchLabels: map[string]string{key: "true"}},
			Device:        v1alpha1.DeviceSelector{Provider: v1alpha1.ProviderSoft},
			VConnsPerNode: ptr[int32](64),
			ResourceName:  "rdmavisor.io/vconn",
		},
	}
}

// createService creates svc and, when the test ends, deletes it and waits
// until the finalizer let it go, so the next test starts clean.
func createService(t *testing.T, svc *v1alpha1.RDMAService) {
	t.Helper()
	if err := k8s.Create(testCtx(t), svc); err != nil {
		t.Fatalf("creating RDMAService %s: %v", svc.Name, err)
	}
	t.Cleanup(func() { deleteService(t, svc.Name) })
}

func deleteService(t *testing.T, name string) {
	t.Helper()
	svc := &v1alpha1.RDMAService{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := client.IgnoreNotFound(k8s.Delete(testCtx(t), svc)); err != nil {
		t.Fatalf("deleting RDMAService %s: %v", name, err)
	}
	poll.UntilNil(t, 30*time.Second, "RDMAService "+name+" is gone", func() error {
		err := k8s.Get(testCtx(t), client.ObjectKey{Name: name}, svc)
		if err == nil {
			return fmt.Errorf("still there, finalizers %v", svc.Finalizers)
		}
		return client.IgnoreNotFound(err)
	})
}

func getService(t *testing.T, name string) *v1alpha1.RDMAService {
	t.Helper()
	svc := &v1alpha1.RDMAService{}
	if err := k8s.Get(testCtx(t), client.ObjectKey{Name: name}, svc); err != nil {
		t.Fatalf("getting RDMAService %s: %v", name, err)
	}
	return svc
}

// waitCondition waits until the service has a reconciled condition of type
// typ with the given status (and reason, if not empty), and returns it.
func waitCondition(t *testing.T, name, typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
	t.Helper()
	var got metav1.Condition
	poll.UntilNil(t, 30*time.Second, fmt.Sprintf("RDMAService %s %s=%s %s", name, typ, status, reason), func() error {
		svc := getService(t, name)
		c := meta.FindStatusCondition(svc.Status.Conditions, typ)
		switch {
		case c == nil:
			return fmt.Errorf("no %s condition in %+v", typ, svc.Status)
		case c.ObservedGeneration != svc.Generation:
			return fmt.Errorf("condition of generation %d, object at %d", c.ObservedGeneration, svc.Generation)
		case c.Status != status || (reason != "" && c.Reason != reason):
			return fmt.Errorf("condition is %s %s: %s", c.Status, c.Reason, c.Message)
		}
		got = *c
		return nil
	})
	return got
}

// reportNode writes an RDMANode as the agent on node would: ready or not,
// with a fresh heartbeat.
func reportNode(t *testing.T, node, service string, ready metav1.ConditionStatus, reason, message string) {
	t.Helper()
	ctx := testCtx(t)
	rn := &v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: node}}
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(rn), rn); err != nil {
		if client.IgnoreNotFound(err) != nil {
			t.Fatal(err)
		}
		rn.Spec.ServiceName = service
		if err := k8s.Create(ctx, rn); err != nil {
			t.Fatalf("creating RDMANode %s: %v", node, err)
		}
		t.Cleanup(func() { _ = client.IgnoreNotFound(k8s.Delete(context.Background(), rn)) })
	}
	meta.SetStatusCondition(&rn.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionNodeReady, Status: ready, Reason: reason, Message: message})
	rn.Status.Devices = []v1alpha1.RDMADevice{{Name: "soft0", Vendor: "rdmavisor", Provider: v1alpha1.ProviderSoft,
		GID: nodeIP(node), NUMANode: ptr[int32](0), Health: v1alpha1.DeviceHealthy}}
	rn.Status.VConnCapacity, rn.Status.VConnsAllocated, rn.Status.VConnsOpen, rn.Status.QPsInUse = 64, 8, 5, 2
	rn.Status.Address = &v1alpha1.AgentAddress{IP: nodeIP(node), ControlPort: 7471}
	rn.Status.HeartbeatTime = ptr(metav1.Now())
	if err := k8s.Status().Update(ctx, rn); err != nil {
		t.Fatalf("updating RDMANode %s status: %v", node, err)
	}
}

// nodeIP is a test node's own address, as a real node has one: 10.0.0.N
// for a name ending in N (kc-1: 10.0.0.1), else one from its name's hash.
// Two nodes of one address are an AddressConflict.
func nodeIP(node string) string {
	i := len(node)
	for i > 0 && node[i-1] >= '0' && node[i-1] <= '9' {
		i--
	}
	if n, err := strconv.Atoi(node[i:]); err == nil && n > 0 && n < 255 {
		return fmt.Sprintf("10.0.0.%d", n)
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(node))
	v := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", 1+v%250, (v>>8)%256, 1+(v>>16)%254)
}
