package dra

import (
	"context"
	"os"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"sigs.k8s.io/yaml"
)

// matches compiles a selector as the scheduler does and applies it to
// the device of e.
func matches(t *testing.T, expr string, e Endpoint) bool {
	t.Helper()
	c := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true}).CompileCELExpression(expr, cel.Options{})
	if c.Error != nil {
		t.Fatalf("%s: %v", expr, c.Error)
	}
	d := e.device("1.2.3")
	ok, _, err := c.DeviceMatches(context.Background(), cel.Device{Driver: DefaultDriverName, AllowMultipleAllocations: d.AllowMultipleAllocations,
		Attributes: d.Attributes, Capacity: d.Capacity})
	if err != nil {
		t.Fatalf("%s: %v", expr, err)
	}
	return ok
}

var (
	ibNUMA1 = Endpoint{Name: "mlx5-1", DeviceName: "mlx5_1", Transport: "InfiniBand", LinkLayer: "InfiniBand", GID: "fe80::1",
		NUMANode: 1, PCIRoot: "pci0000:85", PCIAddress: "0000:86:00.0", VConns: 64}
	softEP = Endpoint{Name: "soft", DeviceName: "soft-10.0.0.1:4791", Transport: "UDP", LinkLayer: "Ethernet", NUMANode: -1, VConns: 8}
)

// The attributes are what users select on with CEL.
func TestCELSelectors(t *testing.T) {
	for _, tc := range []struct {
		expr     string
		ib, soft bool
	}{
		{`device.driver == "rdmavisor.io"`, true, true},
		{`device.attributes["rdmavisor.io"].transport == "InfiniBand"`, true, false},
		{`device.attributes["rdmavisor.io"].linkLayer == "Ethernet"`, false, true},
		{`has(device.attributes["rdmavisor.io"].numaNode) && device.attributes["rdmavisor.io"].numaNode == 1`, true, false},
		{`has(device.attributes["resource.kubernetes.io"].pcieRoot) && device.attributes["resource.kubernetes.io"].pcieRoot == "pci0000:85"`, true, false},
		{`device.attributes["rdmavisor.io"].deviceName.startsWith("mlx5")`, true, false},
		{`device.attributes["rdmavisor.io"].version.isGreaterThan(semver("1.0.0"))`, true, true},
		{`device.capacity["rdmavisor.io"].vconns.compareTo(quantity("16")) >= 0`, true, false},
		{`device.allowMultipleAllocations`, true, true},
	} {
		if got := matches(t, tc.expr, ibNUMA1); got != tc.ib {
			t.Errorf("%s on InfiniBand: %v, want %v", tc.expr, got, tc.ib)
		}
		if got := matches(t, tc.expr, softEP); got != tc.soft {
			t.Errorf("%s on soft: %v, want %v", tc.expr, got, tc.soft)
		}
	}
}

// The sample ResourceClaimTemplate asks for vconns this driver's devices
// have, and its selectors accept them.
func TestSampleClaimTemplate(t *testing.T) {
	b, err := os.ReadFile("../../config/samples/resourceclaimtemplate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var tmpl resourceapi.ResourceClaimTemplate
	if err := yaml.UnmarshalStrict(b, &tmpl); err != nil {
		t.Fatal(err)
	}
	reqs := tmpl.Spec.Spec.Devices.Requests
	if len(reqs) != 1 || reqs[0].Exactly == nil || reqs[0].Exactly.Capacity == nil {
		t.Fatalf("requests %+v", reqs)
	}
	if q, ok := reqs[0].Exactly.Capacity.Requests[CapacityVConns]; !ok || q.Value() < 1 {
		t.Errorf("the sample requests no vconns: %+v", reqs[0].Exactly.Capacity)
	}
	for _, s := range reqs[0].Exactly.Selectors {
		for _, e := range []Endpoint{ibNUMA1, softEP} {
			if !matches(t, s.CEL.Expression, e) {
				t.Errorf("the sample's selector %q refuses %s", s.CEL.Expression, e.Name)
			}
		}
	}
}
