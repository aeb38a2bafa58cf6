// Tests of the objects charts/rdmavisor renders with its defaults and with
// several value sets (helpers in chart_test.go).
package charts_test

import (
	"os"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers"
	"github.com/rdmavisor/rdmavisor/internal/dra"
)

func TestTemplateDefaults(t *testing.T) {
	objs := render(t)
	want := []string{
		"ClusterRole/" + controllers.AgentClusterRole,
		"ClusterRole/" + operator,
		"ClusterRole/" + operator + "-metrics-auth",
		"ClusterRole/" + operator + "-metrics-reader",
		"ClusterRoleBinding/" + operator,
		"ClusterRoleBinding/" + operator + "-metrics-auth",
		"CustomResourceDefinition/rdmanodes.rdmavisor.io",
		"CustomResourceDefinition/rdmaservices.rdmavisor.io",
		"Deployment/" + operator,
		"PodDisruptionBudget/" + operator,
		"Role/" + operator,
		"RoleBinding/" + operator,
		"ServiceAccount/" + operator,
		"ValidatingAdmissionPolicy/" + controllers.AgentPolicy,
		"ValidatingAdmissionPolicy/" + controllers.AgentSlicePolicy,
		"ValidatingAdmissionPolicy/" + controllers.OperatorBindingsPolicy,
		"ValidatingAdmissionPolicy/" + controllers.ServicePolicy,
		"ValidatingAdmissionPolicyBinding/" + controllers.AgentPolicy,
		"ValidatingAdmissionPolicyBinding/" + controllers.AgentSlicePolicy,
		"ValidatingAdmissionPolicyBinding/" + controllers.OperatorBindingsPolicy,
		"ValidatingAdmissionPolicyBinding/" + controllers.ServicePolicy,
	}
	if got := ids(objs); !slices.Equal(got, want) {
		t.Fatalf("rendered objects:\n got %v\nwant %v", got, want)
	}
	for _, o := range objs {
		switch o.Kind {
		case "Deployment", "PodDisruptionBudget", "ServiceAccount", "Role", "RoleBinding":
			if o.Metadata.Namespace != namespace {
				t.Errorf("%s is in namespace %q, want the release's %q", o.id(), o.Metadata.Namespace, namespace)
			}
		}
	}

	var d appsv1.Deployment
	find(t, objs, "Deployment", operator, &d)
	sel := d.Spec.Selector.MatchLabels
	if sel["app.kubernetes.io/instance"] != release || sel["app.kubernetes.io/component"] != "operator" {
		t.Errorf("selector %v: want the release's operator", sel)
	}
	for k, v := range sel {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("pod template labels %v do not match the selector %v", d.Spec.Template.Labels, sel)
			break
		}
	}
	pod := d.Spec.Template.Spec
	// Two replicas, spread over nodes, one at a time disrupted: a lost
	// node takes at most one, and the other holds or takes the lease.
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("replicas %v, want 2", d.Spec.Replicas)
	}
	if a := pod.Affinity; a == nil || a.PodAntiAffinity == nil || len(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 ||
		a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.TopologyKey != "kubernetes.io/hostname" ||
		!reflect.DeepEqual(a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0].PodAffinityTerm.LabelSelector.MatchLabels, sel) {
		t.Errorf("affinity %+v: want the replicas spread over nodes (hostname), selecting the operator's pods", pod.Affinity)
	}
	var pdb policyv1.PodDisruptionBudget
	find(t, objs, "PodDisruptionBudget", operator, &pdb)
	if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 || !reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, sel) {
		t.Errorf("PodDisruptionBudget %+v: want maxUnavailable 1 of the operator's pods", pdb.Spec)
	}
	if pod.ServiceAccountName != operator {
		t.Errorf("serviceAccountName %q, want %q", pod.ServiceAccountName, operator)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	const image = "ghcr.io/rdmavisor/rdmavisor:0.1.0" // appVersion
	if c.Image != image {
		t.Errorf("image %q, want %q", c.Image, image)
	}
	if !slices.Equal(c.Command, []string{"operator"}) {
		t.Errorf("command %q, want [operator]", c.Command)
	}
	wantArgs := []string{
		"--leader-elect=true",
		"--metrics-bind-address=:8443",
		"--metrics-secure=true",
		"--health-probe-bind-address=:8081",
		"--namespace=$(POD_NAMESPACE)",
		"--agent-image=" + image,
	}
	if !slices.Equal(c.Args, wantArgs) {
		t.Errorf("args\n got %q\nwant %q", c.Args, wantArgs)
	}
	if len(c.Env) != 1 || c.Env[0].Name != "POD_NAMESPACE" || c.Env[0].ValueFrom.FieldRef.FieldPath != "metadata.namespace" {
		t.Errorf("env %+v, want POD_NAMESPACE from metadata.namespace", c.Env)
	}
	for probe, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != probe || p.HTTPGet.Port.String() != "health" {
			t.Errorf("probe %s: %+v", probe, p)
		}
	}
	if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot ||
		pod.SecurityContext.RunAsUser == nil || *pod.SecurityContext.RunAsUser == 0 ||
		pod.SecurityContext.SeccompProfile == nil || pod.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want a non-root user and seccompProfile RuntimeDefault", pod.SecurityContext)
	}
	sc := c.SecurityContext
	if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
		sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("container securityContext %+v: want a read-only root, no privilege escalation, ALL capabilities dropped", sc)
	}

	// The rendered CRDs are the generated ones (byte equality of the files
	// is TestCRDsEqualGenerated's).
	for _, name := range []string{"rdmanodes", "rdmaservices"} {
		var got, want map[string]any
		find(t, objs, "CustomResourceDefinition", name+".rdmavisor.io", &got)
		data, err := os.ReadFile("../config/crd/bases/rdmavisor.io_" + name + ".yaml")
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("rendered CRD %s differs from config/crd/bases", name)
		}
	}
}

// TestOperatorReplicas: one replica has no budget and no spread to keep;
// an affinity of the user's replaces the spread; two replicas without
// leader election are refused (both would reconcile).
func TestOperatorReplicas(t *testing.T) {
	objs := render(t, "operator.replicas=1")
	if slices.Contains(ids(objs), "PodDisruptionBudget/"+operator) {
		t.Error("a PodDisruptionBudget for one replica: it would block every drain")
	}
	var d appsv1.Deployment
	find(t, objs, "Deployment", operator, &d)
	if d.Spec.Template.Spec.Affinity != nil {
		t.Errorf("one replica: affinity %+v, want none", d.Spec.Template.Spec.Affinity)
	}
	find(t, render(t, "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=k",
		"affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator=Exists"), "Deployment", operator, &d)
	if a := d.Spec.Template.Spec.Affinity; a == nil || a.NodeAffinity == nil || a.PodAntiAffinity != nil {
		t.Errorf("affinity %+v: want the user's, alone", a)
	}
	args := []string{"template", release, chartDir, "--namespace", namespace, "--set", "operator.leaderElect=false"}
	if out, err := runHelm(t, args...); err == nil || !strings.Contains(err.Error()+out, "needs operator.leaderElect") {
		t.Errorf("two replicas without leader election: %v\n%s", err, out)
	}
}

// TestOperatorFlags checks that every flag the chart passes is one
// cmd/operator defines.
func TestOperatorFlags(t *testing.T) {
	src, err := os.ReadFile("../cmd/operator/main.go")
	if err != nil {
		t.Fatal(err)
	}
	defined := map[string]bool{}
	for _, m := range regexp.MustCompile(`flag\.\w+Var\(&\w+, "([^"]+)"`).FindAllSubmatch(src, -1) {
		defined[string(m[1])] = true
	}
	var d appsv1.Deployment
	find(t, render(t, "operator.metricsPort=0"), "Deployment", operator, &d)
	c := d.Spec.Template.Spec.Containers[0]
	for _, a := range c.Args {
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !defined[name] {
			t.Errorf("the chart passes %s, which cmd/operator does not define (it defines %v)", a, defined)
		}
	}
	if !slices.Contains(c.Args, "--metrics-bind-address=0") {
		t.Errorf("metricsPort 0: args %q, want --metrics-bind-address=0", c.Args)
	}
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			t.Errorf("metricsPort 0 still exposes port %+v", p)
		}
	}
}

func TestTemplateDefaultService(t *testing.T) {
	objs := render(t,
		"defaultService.enabled=true",
		"defaultService.device.provider=soft",
		"image.repository=local.test/rdmavisor",
		"image.tag=dev",
		"image.pullPolicy=Never")
	var svc v1alpha1.RDMAService
	// Strict: every rendered field is one the API type has.
	find(t, objs, "RDMAService", "default", &svc)
	if svc.APIVersion != v1alpha1.GroupVersion.String() {
		t.Errorf("apiVersion %q, want %q", svc.APIVersion, v1alpha1.GroupVersion)
	}
	s := svc.Spec
	if s.Device.Provider != v1alpha1.Provider("soft") || s.Device.Names != nil || s.Device.Vendors != nil {
		t.Errorf("device %+v, want provider soft and no names or vendors", s.Device)
	}
	if s.Agent.Image != "local.test/rdmavisor:dev" || s.Agent.ImagePullPolicy != corev1.PullNever {
		t.Errorf("agent %+v, want the chart's image local.test/rdmavisor:dev, pull policy Never", s.Agent)
	}
	if s.Transport != "auto" || *s.QPsPerPeer != 2 || *s.VConnsPerNode != 1024 ||
		s.BufferPoolSize.String() != "64Mi" || s.ResourceName != "rdmavisor.io/vconn" {
		t.Errorf("spec %+v: want the values.yaml defaults", s)
	}
	if s.NodeSelector != nil || s.Tolerations != nil || s.SocketGroup != nil {
		t.Errorf("spec %+v: want no node selector, no tolerations and no socket group", s)
	}
	if svc.Namespace != "" {
		t.Errorf("RDMAService is cluster-scoped, rendered in namespace %q", svc.Namespace)
	}

	var d appsv1.Deployment
	find(t, objs, "Deployment", operator, &d)
	c := d.Spec.Template.Spec.Containers[0]
	if c.Image != "local.test/rdmavisor:dev" || c.ImagePullPolicy != corev1.PullNever {
		t.Errorf("operator image %q, pull policy %q", c.Image, c.ImagePullPolicy)
	}
}

func TestTemplateDefaultServiceHardware(t *testing.T) {
	objs := render(t,
		"defaultService.enabled=true",
		"defaultService.name=fabric",
		"defaultService.device.vendors={mellanox}",
		"defaultService.device.names={mlx5_0,mlx5_1}",
		"defaultService.device.rails=2",
		"string:defaultService.nodeSelector.matchLabels.rdmavisor\\.io/rdma=true",
		"defaultService.tolerations[0].key=rdmavisor.io/rdma",
		"defaultService.tolerations[0].operator=Exists",
		"defaultService.agent.resources.limits.memory=1Gi",
		"defaultService.socketGroup=2147483647",
		"defaultService.limits.listeners=1",
		"defaultService.limits.messageRate=500",
		"defaultService.limits.regionSize=256Mi")
	var svc v1alpha1.RDMAService
	find(t, objs, "RDMAService", "fabric", &svc)
	s := svc.Spec
	if s.Device.Provider != "ibverbs" || !slices.Equal(s.Device.Vendors, []string{"mellanox"}) || s.Device.Rails != 2 {
		t.Errorf("device %+v", s.Device)
	}
	if s.NodeSelector == nil || s.NodeSelector.MatchLabels["rdmavisor.io/rdma"] != "true" {
		t.Errorf("nodeSelector %+v", s.NodeSelector)
	}
	if len(s.Tolerations) != 1 || s.Tolerations[0].Key != "rdmavisor.io/rdma" {
		t.Errorf("tolerations %+v", s.Tolerations)
	}
	if s.Agent.Resources == nil || s.Agent.Resources.Limits.Memory().String() != "1Gi" {
		t.Errorf("agent resources %+v", s.Agent.Resources)
	}
	if s.SocketGroup == nil || *s.SocketGroup != v1alpha1.MaxSocketGroup {
		t.Errorf("socketGroup %v, want %d", s.SocketGroup, v1alpha1.MaxSocketGroup)
	}
	if l := s.Limits; l == nil || l.Listeners == nil || *l.Listeners != 1 || l.MessageRate == nil || *l.MessageRate != 500 ||
		l.RegionSize == nil || l.RegionSize.String() != "256Mi" || l.Sessions != nil {
		t.Errorf("limits %+v, want listeners 1, messageRate 500, regionSize 256Mi and no more", l)
	}
}

func TestSchemaRejects(t *testing.T) {
	for name, set := range map[string]string{
		"pull policy":      "image.pullPolicy=Sometimes",
		"transport":        "defaultService.transport=tcp",
		"provider":         "defaultService.device.provider=verbs",
		"qps per peer":     "defaultService.qpsPerPeer=65",
		"resource name":    "defaultService.resourceName=vconn",
		"foreign resource": "defaultService.resourceName=nvidia.com/gpu",
		"agent GPU":        "defaultService.agent.resources.requests.nvidia\\.com/gpu=1",
		"service name":     "defaultService.name=Default",
		"replicas":         "operator.replicas=-1",
		"unknown key":      "imageTag=dev",
		"soft with names":  "defaultService.device.provider=soft,defaultService.device.names={mlx5_0}",
		"socket group":     "defaultService.socketGroup=-1",
		"socket group big": "defaultService.socketGroup=2147483648",
		"no listeners":     "defaultService.limits.listeners=0",
		"limit typo":       "defaultService.limits.listener=1",
		"region size":      "defaultService.limits.regionSize=lots",
	} {
		t.Run(name, func(t *testing.T) {
			out, err := runHelm(t, "template", release, chartDir, "--set", set)
			if err == nil {
				t.Fatalf("helm template --set %s succeeded, want a schema error:\n%s", set, out)
			}
			if !strings.Contains(err.Error(), "schema") {
				t.Errorf("helm template --set %s failed, but not on the schema: %v", set, err)
			}
		})
	}
}

// TestTemplateMetrics: with secure metrics (the default) the operator may
// create the TokenReviews and SubjectAccessReviews that authenticate and
// authorize scrapers, and scrapers get a ClusterRole to bind; without them
// (plain HTTP, or no endpoint) the chart grants neither. The dashboard
// ConfigMap, off by default, carries the sidecar's label and the
// dashboard file as it is.
func TestTemplateMetrics(t *testing.T) {
	var auth rbacv1.ClusterRole
	objs := render(t)
	find(t, objs, "ClusterRole", operator+"-metrics-auth", &auth)
	want := []rbacv1.PolicyRule{
		{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
		{APIGroups: []string{"authorization.k8s.io"}, Resources: []string{"subjectaccessreviews"}, Verbs: []string{"create"}},
	}
	if !reflect.DeepEqual(auth.Rules, want) {
		t.Errorf("metrics-auth rules %+v, want %+v", auth.Rules, want)
	}
	var b rbacv1.ClusterRoleBinding
	find(t, objs, "ClusterRoleBinding", operator+"-metrics-auth", &b)
	if b.RoleRef.Name != operator+"-metrics-auth" || len(b.Subjects) != 1 || b.Subjects[0].Name != operator || b.Subjects[0].Namespace != namespace {
		t.Errorf("metrics-auth binding %+v", b)
	}
	var reader rbacv1.ClusterRole
	find(t, objs, "ClusterRole", operator+"-metrics-reader", &reader)
	if len(reader.Rules) != 1 || !slices.Equal(reader.Rules[0].NonResourceURLs, []string{"/metrics"}) || !slices.Equal(reader.Rules[0].Verbs, []string{"get"}) {
		t.Errorf("metrics-reader rules %+v, want get on /metrics", reader.Rules)
	}
	for _, set := range [][]string{{"operator.metricsSecure=false"}, {"operator.metricsPort=0"}} {
		for _, o := range render(t, set...) {
			if strings.HasSuffix(o.Metadata.Name, "-metrics-auth") || set[0] == "operator.metricsPort=0" && strings.HasSuffix(o.Metadata.Name, "-metrics-reader") {
				t.Errorf("%v renders %s", set, o.id())
			}
			if o.Kind == "Deployment" && set[0] == "operator.metricsSecure=false" && !strings.Contains(string(o.raw), "--metrics-secure=false") {
				t.Errorf("%v: the operator is not told --metrics-secure=false", set)
			}
		}
	}

	for _, o := range objs {
		if o.Kind == "ConfigMap" {
			t.Errorf("dashboards are off by default, yet %s is rendered", o.id())
		}
	}
	var cm corev1.ConfigMap
	find(t, render(t, "dashboards.enabled=true"), "ConfigMap", release+"-dashboards", &cm)
	if cm.Labels["grafana_dashboard"] != "1" || cm.Namespace != namespace {
		t.Errorf("dashboard ConfigMap labels %v in %q: want grafana_dashboard=1 in %q", cm.Labels, cm.Namespace, namespace)
	}
	file, err := os.ReadFile("rdmavisor/dashboards/rdmavisor.json")
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(cm.Data["rdmavisor.json"]) != strings.TrimSpace(string(file)) {
		t.Error("the ConfigMap's rdmavisor.json differs from dashboards/rdmavisor.json")
	}
}

// The DRA driver's DeviceClass selects the driver's devices, and maps an
// extended resource only when asked to.
func TestDeviceClass(t *testing.T) {
	for name, tc := range map[string]struct {
		set      []string
		extended string
	}{
		"plain":             {set: []string{"dra.deviceClass.enabled=true"}},
		"extended resource": {set: []string{"dra.deviceClass.enabled=true", "dra.deviceClass.extendedResourceName=rdmavisor.io/vconn"}, extended: "rdmavisor.io/vconn"},
	} {
		t.Run(name, func(t *testing.T) {
			var dc resourcev1.DeviceClass
			find(t, render(t, tc.set...), "DeviceClass", "vconn.rdmavisor.io", &dc)
			if len(dc.Spec.Selectors) != 1 || dc.Spec.Selectors[0].CEL == nil || dc.Spec.Selectors[0].CEL.Expression != `device.driver == "`+dra.DefaultDriverName+`"` {
				t.Errorf("selectors %+v", dc.Spec.Selectors)
			}
			if got := ptr.Deref(dc.Spec.ExtendedResourceName, ""); got != tc.extended {
				t.Errorf("extendedResourceName %q, want %q", got, tc.extended)
			}
		})
	}
}
