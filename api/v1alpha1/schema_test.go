package v1alpha1_test

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// specSchema is the generated RDMAService CRD's schema of spec's fields.
func specSchema(t *testing.T) map[string]apiextensionsv1.JSONSchemaProps {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "config", "crd", "bases", "rdmavisor.io_rdmaservices.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(data, &crd); err != nil {
		t.Fatal(err)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["spec"].Properties
}

// TestSchemaMatchesConstants checks the generated CRD's bounds and defaults
// against the Go constants and the agent config's limits, which the markers
// can only repeat as literals.
func TestSchemaMatchesConstants(t *testing.T) {
	spec := specSchema(t)
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
			1, v1alpha1.MaxQPsPerPeer, strconv.Itoa(v1alpha1.DefaultQPsPerPeer), 1, config.MaxQPsPerPeer},
		{"vconnsPerNode", num(spec["vconnsPerNode"].Minimum), num(spec["vconnsPerNode"].Maximum), string(spec["vconnsPerNode"].Default.Raw),
			1, v1alpha1.MaxVConnsPerNode, strconv.Itoa(v1alpha1.DefaultVConnsPerNode), 1, config.MaxVConnsPerNode},
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
	checkLimitsSchema(t, spec["limits"].Properties)
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

// TestSharedSettingsAgree holds the API, which may not import internal
// packages, to the one definition of the transports and of the QPs per
// peer (internal/transport) that the agent's configuration, the engine and
// the SDK take theirs from: the CRD's generated default and enum, the API's
// constants, the chart's values, the configuration's and the engine's defaults.
func TestSharedSettingsAgree(t *testing.T) {
	spec := specSchema(t)

	crdDef, err := strconv.Atoi(string(spec["qpsPerPeer"].Default.Raw))
	if err != nil {
		t.Errorf("the CRD's qpsPerPeer default %q: %v", spec["qpsPerPeer"].Default.Raw, err)
	}
	// The chart's defaultService spells its defaults out, for its users to
	// read and change: it must say what the CRD would default.
	var values struct {
		DefaultService struct {
			Transport  string `json:"transport"`
			QPsPerPeer int    `json:"qpsPerPeer"`
		} `json:"defaultService"`
	}
	data, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "charts", "rdmavisor", "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	for where, n := range map[string]int{
		"the chart's values": values.DefaultService.QPsPerPeer,
		"the CRD":            crdDef,
		"the API":            v1alpha1.DefaultQPsPerPeer,
		"the agent config":   config.Default().QPsPerPeer,
		"the engine":         engine.DefaultQPsPerPeer,
	} {
		if n != transport.DefaultQPsPerPeer {
			t.Errorf("qpsPerPeer defaults to %d in %s, %d in internal/transport", n, where, transport.DefaultQPsPerPeer)
		}
	}
	if v1alpha1.MaxQPsPerPeer != transport.MaxQPsPerPeer || config.MaxQPsPerPeer != transport.MaxQPsPerPeer {
		t.Errorf("qpsPerPeer bound: API %d, agent config %d, internal/transport %d", v1alpha1.MaxQPsPerPeer, config.MaxQPsPerPeer, transport.MaxQPsPerPeer)
	}

	var enum []string
	for _, v := range spec["transport"].Enum {
		var s string
		if err := yaml.Unmarshal(v.Raw, &s); err != nil {
			t.Fatal(err)
		}
		enum = append(enum, s)
	}
	spelled := map[string][]string{
		"the CRD's enum":   enum,
		"the API":          {string(v1alpha1.TransportRC), string(v1alpha1.TransportUC), string(v1alpha1.TransportUD), string(v1alpha1.TransportAuto)},
		"the agent config": {string(config.TransportRC), string(config.TransportUC), string(config.TransportUD), string(config.TransportAuto)},
		"the SDK (vconn)":  {string(vconn.TransportRC), string(vconn.TransportUC), string(vconn.TransportUD), string(vconn.TransportAuto)},
	}
	for where, names := range spelled {
		if !slices.Equal(names, transport.Names()) {
			t.Errorf("%s spells the transports %q, internal/transport %q", where, names, transport.Names())
		}
	}
	if def, cfg := string(spec["transport"].Default.Raw), string(config.Default().Transport); def != `"`+cfg+`"` || values.DefaultService.Transport != cfg {
		t.Errorf("transport defaults to %s in the CRD, %q in the chart's values, %q in the agent config", def, values.DefaultService.Transport, cfg)
	}
}

// checkLimitsSchema holds spec.limits' schema to the API's constants, and
// those to the agent configuration's bounds: the integers' minimum and
// maximum, and the quantities' rules, which must hold both bounds.
func checkLimitsSchema(t *testing.T, limits map[string]apiextensionsv1.JSONSchemaProps) {
	t.Helper()
	for _, c := range []struct {
		field              string
		least, most        float64
		configL, configMax int64
	}{
		{"sessions", 1, v1alpha1.MaxSessions, 1, config.MaxSessions},
		{"listeners", 1, v1alpha1.MaxListeners, 1, config.MaxListeners},
		{"regions", 1, v1alpha1.MaxRegions, 1, config.MaxRegions},
		{"messageRate", 0, v1alpha1.MaxMessageRate, 0, config.MaxMessageRate},
	} {
		p := limits[c.field]
		if p.Minimum == nil || p.Maximum == nil || *p.Minimum != c.least || *p.Maximum != c.most {
			t.Errorf("limits.%s: schema min %v max %v, want %v %v", c.field, p.Minimum, p.Maximum, c.least, c.most)
		}
		if float64(c.configL) != c.least || float64(c.configMax) != c.most {
			t.Errorf("limits.%s: agent config allows %d..%d, the API %v..%v", c.field, c.configL, c.configMax, c.least, c.most)
		}
	}
	for _, c := range []struct {
		field              string
		least, most        string
		configL, configMax int64
	}{
		{"regionSize", v1alpha1.MinRegionSize, v1alpha1.MaxRegionSize, 1, config.MaxRegionBytes},
		{"queuedSize", v1alpha1.MinQueuedSize, v1alpha1.MaxQueuedSize, config.MinQueuedBytes, config.MaxQueuedBytes},
		{"registeredSize", v1alpha1.MinRegisteredSize, v1alpha1.MaxRegisteredSize, 1, config.MaxRegisteredBytes},
		{"byteRate", "0", v1alpha1.MaxByteRate, 0, config.MaxByteRate},
	} {
		if least, most := resource.MustParse(c.least), resource.MustParse(c.most); least.Value() != c.configL || most.Value() != c.configMax {
			t.Errorf("limits.%s: API %s..%s, agent config %d..%d", c.field, c.least, c.most, c.configL, c.configMax)
		}
		rules := ""
		for _, r := range limits[c.field].XValidations {
			rules += r.Rule
		}
		for _, b := range []string{c.least, c.most} {
			if !strings.Contains(rules, "quantity('"+b+"')") {
				t.Errorf("limits.%s: no rule holds the bound %s", c.field, b)
			}
		}
	}
}
