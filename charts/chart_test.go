// Tests of the Helm chart in charts/rdmavisor: helm lint and helm template
// with several value sets, the rendered objects, and that the chart's CRDs
// and RBAC rules are those controller-gen generates into config/.
//
// helm itself comes from hack/helm.sh, which builds a pinned version into a
// cache; hack/test.sh sets HELM to its path.
package charts_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/controllers"
)

const (
	chartDir  = "rdmavisor"
	release   = "rdmavisor"
	namespace = "rdmavisor-system"
	operator  = "rdmavisor-operator"
)

// helmBinary returns the helm binary named by $HELM.
func helmBinary(t *testing.T) string {
	t.Helper()
	h := os.Getenv("HELM")
	if h == "" {
		t.Fatal("HELM is not set: run hack/test.sh, or HELM=\"$(hack/helm.sh)\" go test ./charts/")
	}
	return h
}

// runHelm runs helm with args and returns its stdout, or its error and
// stderr. HOME-like state goes to a temporary directory, so the test reads
// no user configuration and writes nothing outside it.
func runHelm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	tmp := t.TempDir()
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(tmp, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(tmp, "config"),
		"HELM_DATA_HOME="+filepath.Join(tmp, "data"),
		"KUBECONFIG="+filepath.Join(tmp, "no-kubeconfig"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &helmError{err: err, stderr: stderr.String() + stdout.String()}
	}
	return stdout.String(), nil
}

type helmError struct {
	err    error
	stderr string
}

func (e *helmError) Error() string { return e.err.Error() + ": " + e.stderr }

// object is one rendered manifest: its identity, and its raw YAML for
// decoding into a typed object.
type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	raw []byte
}

func (o object) id() string { return o.Kind + "/" + o.Metadata.Name }

// render runs helm template with the chart's CRDs and the given values,
// each passed with --set, or with --set-string when prefixed "string:", and
// splits the output into objects.
func render(t *testing.T, set ...string) []object {
	t.Helper()
	args := []string{"template", release, chartDir, "--namespace", namespace, "--include-crds"}
	for _, s := range set {
		if v, ok := strings.CutPrefix(s, "string:"); ok {
			args = append(args, "--set-string", v)
		} else {
			args = append(args, "--set", s)
		}
	}
	out, err := runHelm(t, args...)
	if err != nil {
		t.Fatalf("helm %s: %v", strings.Join(args, " "), err)
	}
	var objs []object
	for _, doc := range docSep.Split(out, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var o object
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("decoding a rendered manifest: %v\n%s", err, doc)
		}
		if o.Kind == "" {
			t.Fatalf("rendered manifest without a kind:\n%s", doc)
		}
		o.raw = []byte(doc)
		objs = append(objs, o)
	}
	return objs
}

// docSep separates the documents of a YAML stream.
var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// find decodes the object kind/name of objs into into, failing if absent.
func find(t *testing.T, objs []object, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			if err := yaml.UnmarshalStrict(o.raw, into); err != nil {
				t.Fatalf("decoding %s/%s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s/%s rendered; have %v", kind, name, ids(objs))
}

func ids(objs []object) []string {
	var s []string
	for _, o := range objs {
		s = append(s, o.id())
	}
	slices.Sort(s)
	return s
}

func TestCRDsEqualGenerated(t *testing.T) {
	want, err := filepath.Glob("../config/crd/bases/*.yaml")
	if err != nil || len(want) == 0 {
		t.Fatalf("no generated CRDs in config/crd/bases: %v", err)
	}
	got, _ := filepath.Glob(chartDir + "/crds/*.yaml")
	base := func(ps []string) []string {
		var b []string
		for _, p := range ps {
			b = append(b, filepath.Base(p))
		}
		return b
	}
	if !slices.Equal(base(got), base(want)) {
		t.Fatalf("chart CRDs %v, generated %v: copy config/crd/bases/*.yaml to charts/rdmavisor/crds/", base(got), base(want))
	}
	for _, p := range want {
		w, _ := os.ReadFile(p)
		g, _ := os.ReadFile(filepath.Join(chartDir, "crds", filepath.Base(p)))
		if !bytes.Equal(g, w) {
			t.Errorf("charts/rdmavisor/crds/%s differs from %s: copy it", filepath.Base(p), p)
		}
	}
}

func TestLint(t *testing.T) {
	for name, set := range map[string][]string{
		"defaults": nil,
		"soft":     {"defaultService.enabled=true", "defaultService.device.provider=soft"},
	} {
		t.Run(name, func(t *testing.T) {
			args := []string{"lint", "--strict", chartDir}
			for _, s := range set {
				args = append(args, "--set", s)
			}
			if out, err := runHelm(t, args...); err != nil {
				t.Fatalf("helm lint: %v\n%s", err, out)
			}
		})
	}
}

// TestRBACEqualsGenerated checks the chart's operator ClusterRole and Role
// against config/rbac/role.yaml, which controller-gen generates from the
// controllers' +kubebuilder:rbac markers.
func TestRBACEqualsGenerated(t *testing.T) {
	data, err := os.ReadFile("../config/rbac/role.yaml")
	if err != nil {
		t.Fatal(err)
	}
	generated := map[string][]rbacv1.PolicyRule{}
	for _, doc := range docSep.Split(string(data), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		var r struct {
			Kind  string              `json:"kind"`
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
			t.Fatalf("config/rbac/role.yaml: %v", err)
		}
		generated[r.Kind] = r.Rules
	}
	if len(generated["ClusterRole"]) == 0 || len(generated["Role"]) == 0 {
		t.Fatalf("config/rbac/role.yaml holds no ClusterRole or no Role rules: %v", generated)
	}

	objs := render(t)
	var cr rbacv1.ClusterRole
	find(t, objs, "ClusterRole", operator, &cr)
	if !reflect.DeepEqual(cr.Rules, generated["ClusterRole"]) {
		t.Errorf("chart ClusterRole rules differ from config/rbac/role.yaml: update charts/rdmavisor/templates/rbac.yaml\n got %+v\nwant %+v",
			cr.Rules, generated["ClusterRole"])
	}
	var role rbacv1.Role
	find(t, objs, "Role", operator, &role)
	if !reflect.DeepEqual(role.Rules, generated["Role"]) {
		t.Errorf("chart Role rules differ from config/rbac/role.yaml: update charts/rdmavisor/templates/rbac.yaml\n got %+v\nwant %+v",
			role.Rules, generated["Role"])
	}

	for _, kind := range []string{"ClusterRoleBinding", "RoleBinding"} {
		var b rbacv1.RoleBinding // a ClusterRoleBinding decodes into the same fields
		find(t, objs, kind, operator, &b)
		wantRef := strings.TrimSuffix(kind, "Binding")
		if b.RoleRef.Kind != wantRef || b.RoleRef.Name != operator {
			t.Errorf("%s roleRef %+v, want %s/%s", kind, b.RoleRef, wantRef, operator)
		}
		want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: operator, Namespace: namespace}}
		if !reflect.DeepEqual(b.Subjects, want) {
			t.Errorf("%s subjects %+v, want %+v", kind, b.Subjects, want)
		}
	}
}

// TestAgentRBACEqualsController checks the agents' ClusterRole and the
// admission policies the chart installs against controllers/static.go, whose
// objects the operator's envtests run against.
func TestAgentRBACEqualsController(t *testing.T) {
	objs := render(t)
	var role rbacv1.ClusterRole
	find(t, objs, "ClusterRole", controllers.AgentClusterRole, &role)
	if want := controllers.NewAgentClusterRole(); !reflect.DeepEqual(role.Rules, want.Rules) {
		t.Errorf("chart ClusterRole %s rules differ from controllers.AgentRules: update charts/rdmavisor/templates/agent-rbac.yaml\n got %+v\nwant %+v",
			role.Name, role.Rules, want.Rules)
	}
	agent, agentBinding := controllers.NewAgentPolicy(namespace)
	op, opBinding := controllers.NewOperatorBindingsPolicy(namespace, "system:serviceaccount:"+namespace+":"+operator)
	slicePolicy, sliceBinding := controllers.NewAgentSlicePolicy(namespace)
	for _, want := range []*admissionregistrationv1.ValidatingAdmissionPolicy{agent, op, slicePolicy} {
		var got admissionregistrationv1.ValidatingAdmissionPolicy
		find(t, objs, "ValidatingAdmissionPolicy", want.Name, &got)
		if !reflect.DeepEqual(got.Spec, want.Spec) {
			t.Errorf("chart ValidatingAdmissionPolicy %s differs from controllers/static.go: update charts/rdmavisor/templates/agent-rbac.yaml\n got %+v\nwant %+v",
				want.Name, got.Spec, want.Spec)
		}
	}
	for _, want := range []*admissionregistrationv1.ValidatingAdmissionPolicyBinding{agentBinding, opBinding, sliceBinding} {
		var got admissionregistrationv1.ValidatingAdmissionPolicyBinding
		find(t, objs, "ValidatingAdmissionPolicyBinding", want.Name, &got)
		if !reflect.DeepEqual(got.Spec, want.Spec) {
			t.Errorf("chart ValidatingAdmissionPolicyBinding %s: got %+v, want %+v", want.Name, got.Spec, want.Spec)
		}
	}
}

// TestServicePolicy: the policy that reserves spec.agent.image and
// spec.tolerations is controllers.NewServicePolicy with the values' users
// and groups and the chart's image (TestServiceFieldsPolicy in controllers
// shows what it refuses), and can be turned off.
func TestServicePolicy(t *testing.T) {
	for name, tc := range map[string]struct {
		set           []string
		users, groups []string
	}{
		"defaults": {groups: []string{"system:masters"}},
		"configured": {
			set:    []string{"rdmaServicePolicy.allowedUsers={alice,bob}", "rdmaServicePolicy.allowedGroups=null", "image.tag=dev"},
			users:  []string{"alice", "bob"},
			groups: nil,
		},
	} {
		t.Run(name, func(t *testing.T) {
			image := "ghcr.io/rdmavisor/rdmavisor:0.1.0"
			if len(tc.set) > 0 {
				image = "ghcr.io/rdmavisor/rdmavisor:dev"
			}
			objs := render(t, tc.set...)
			want, wantBinding := controllers.NewServicePolicy(image, tc.users, tc.groups)
			var got admissionregistrationv1.ValidatingAdmissionPolicy
			find(t, objs, "ValidatingAdmissionPolicy", controllers.ServicePolicy, &got)
			if !reflect.DeepEqual(got.Spec, want.Spec) {
				t.Errorf("chart policy differs from controllers.NewServicePolicy: update charts/rdmavisor/templates/service-policy.yaml\n got %+v\nwant %+v", got.Spec, want.Spec)
			}
			var gotBinding admissionregistrationv1.ValidatingAdmissionPolicyBinding
			find(t, objs, "ValidatingAdmissionPolicyBinding", controllers.ServicePolicy, &gotBinding)
			if !reflect.DeepEqual(gotBinding.Spec, wantBinding.Spec) {
				t.Errorf("binding %+v, want %+v", gotBinding.Spec, wantBinding.Spec)
			}
		})
	}
	for _, o := range render(t, "rdmaServicePolicy.enabled=false") {
		if o.Metadata.Name == controllers.ServicePolicy {
			t.Errorf("rdmaServicePolicy.enabled=false renders %s", o.id())
		}
	}
}
