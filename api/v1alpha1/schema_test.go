package v1alpha1_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
)

// TestSchemaMatchesConstants checks the generated CRD's bounds and defaults
// against the Go constants and the agent config's limits, which the markers
// can only repeat as literals.
func TestSchemaMatchesConstants(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "rdmavisor.io_rdmaservices.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatal(err)
	}
	spec := crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties
	num := func(f *float64) float64 {
		if f == nil {
			return -1
		}
		return *f
	}
	tests := []struct {
		field                string
		min, max             float64
		def                  string
		wantMin, wantMax     float64
		wantDef              string
		configMin, configMax float64
	}{
		{"qpsPerPeer", num(spec["qpsPerPeer"].Minimum), num(spec["qpsPerPeer"].Maximum), string(spec["qpsPerPeer"].Default.Raw),
			1, v1alpha1.MaxQPsPerPeer, "2", 1, config.MaxQPsPerPeer},
		{"vconnsPerNode", num(spec["vconnsPerNode"].Minimum), num(spec["vconnsPerNode"].Maximum), string(spec["vconnsPerNode"].Default.Raw),
			1, v1alpha1.MaxVConnsPerNode, "1024", 1, config.MaxVConnsPerNode},
	}
	for _, tt := range tests {
		if tt.min != tt.wantMin || tt.max != tt.wantMax || tt.def != tt.wantDef {
			t.Errorf("%s: schema min %v max %v default %s, want %v %v %s", tt.field, tt.min, tt.max, tt.def, tt.wantMin, tt.wantMax, tt.wantDef)
		}
		if tt.configMin != tt.wantMin || tt.configMax != tt.wantMax {
			t.Errorf("%s: agent config allows %v..%v, the API %v..%v", tt.field, tt.configMin, tt.configMax, tt.wantMin, tt.wantMax)
		}
	}
	if v1alpha1.DefaultQPsPerPeer != config.DefaultQPsPerPeer || v1alpha1.DefaultVConnsPerNode != config.DefaultVConnsPerNode ||
		v1alpha1.DefaultResourceName != config.DefaultResourceName {
		t.Error("API and agent config defaults differ")
	}
	for _, c := range []struct {
		api    string
		config int64
	}{
		{v1alpha1.MinBufferPoolSize, config.MinBufferPoolBytes},
		{v1alpha1.MaxBufferPoolSize, config.MaxBufferPoolBytes},
		{v1alpha1.DefaultBufferPoolSize, config.DefaultBufferPoolBytes},
	} {
		if q := resource.MustParse(c.api); q.Value() != c.config {
			t.Errorf("buffer pool bound %s = %d bytes, agent config has %d", c.api, q.Value(), c.config)
		}
	}
	if min, max := num(spec["socketGroup"].Minimum), num(spec["socketGroup"].Maximum); min != 0 || max != v1alpha1.MaxSocketGroup {
		t.Errorf("socketGroup: schema min %v max %v, want 0 %d", min, max, v1alpha1.MaxSocketGroup)
	}
	if got := string(spec["resourceName"].Default.Raw); got != `"`+v1alpha1.DefaultResourceName+`"` {
		t.Errorf("resourceName default %s", got)
	}
	// The domain the schema allows is the one the device plugin serves
	// and recognises its sockets by.
	if v1alpha1.ResourceDomain != deviceplugin.ResourceDomain ||
		!strings.HasPrefix(v1alpha1.DefaultResourceName, v1alpha1.ResourceDomain+"/") {
		t.Errorf("resource domains: API %s, device plugin %s, default %s", v1alpha1.ResourceDomain, deviceplugin.ResourceDomain, v1alpha1.DefaultResourceName)
	}
	domainRule := "^" + strings.ReplaceAll(v1alpha1.ResourceDomain, ".", "[.]") + "/"
	if !slices.ContainsFunc(spec["resourceName"].XValidations, func(r apiextensionsv1.ValidationRule) bool {
		return strings.Contains(r.Rule, domainRule)
	}) {
		t.Errorf("no resourceName rule holds %s", domainRule)
	}
	rules := ""
	for _, r := range spec["agent"].Properties["resources"].XValidations {
		rules += r.Rule + "\n"
	}
	for _, bound := range []string{v1alpha1.MaxAgentCPURequest, v1alpha1.MaxAgentMemoryRequest} {
		if !strings.Contains(rules, "quantity('"+bound+"')") {
			t.Errorf("the agent resources' rules do not hold the bound %s", bound)
		}
	}
}
