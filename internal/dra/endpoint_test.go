package dra

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev/rdmadevtest"
)

// The agent's device is located by sysfs: transport, link layer, NUMA
// node and PCI root are the device's; the soft provider's has none.
func TestEndpoints(t *testing.T) {
	rails, err := rdmadev.List(rdmadevtest.TwoNUMA(t), rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		st   admin.Status
		want []Endpoint
	}{
		{"InfiniBand on node 1", admin.Status{Device: "mlx5_1", GID: "fe80::1", Capacity: 64},
			[]Endpoint{{Name: "mlx5-1", DeviceName: "mlx5_1", Transport: "InfiniBand", LinkLayer: "InfiniBand", GID: "fe80::1",
				NUMANode: 1, PCIRoot: "pci0000:85", PCIAddress: "0000:86:00.0", VConns: 64}}},
		{"RoCE on node 0", admin.Status{Device: "mlx5_0", GID: "::ffff:10.0.0.1", Capacity: 8},
			[]Endpoint{{Name: "mlx5-0", DeviceName: "mlx5_0", Transport: "RoCE", LinkLayer: "Ethernet", GID: "::ffff:10.0.0.1",
				NUMANode: 0, PCIRoot: "pci0000:3a", PCIAddress: "0000:3b:00.0", VConns: 8}}},
		{"soft", admin.Status{Device: "soft-10.0.0.1:4791", GID: "::ffff:10.0.0.1", Capacity: 8},
			[]Endpoint{{Name: "soft", DeviceName: "soft-10.0.0.1:4791", Transport: "UDP", LinkLayer: "Ethernet", GID: "::ffff:10.0.0.1",
				NUMANode: -1, VConns: 8}}},
		{"no device yet", admin.Status{Capacity: 8}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Endpoints(tc.st, rails)
			if len(got) != len(tc.want) || (len(got) > 0 && got[0] != tc.want[0]) {
				t.Errorf("Endpoints = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// A device carries what CEL selects on, allows many allocations, and
// lends one vconn to a request that names none.
func TestDevice(t *testing.T) {
	e := Endpoint{Name: "mlx5-1", DeviceName: "mlx5_1", Transport: "InfiniBand", LinkLayer: "InfiniBand", GID: "fe80::1",
		NUMANode: 1, PCIRoot: "pci0000:85", PCIAddress: "0000:86:00.0", VConns: 64}
	d := e.device("1.2.3")
	str := func(k string) string {
		if a, ok := d.Attributes[resourceQN(k)]; ok && a.StringValue != nil {
			return *a.StringValue
		}
		return "<none>"
	}
	for k, want := range map[string]string{"transport": "InfiniBand", "linkLayer": "InfiniBand", "deviceName": "mlx5_1", "gid": "fe80::1",
		"pciRoot": "pci0000:85", "resource.kubernetes.io/pcieRoot": "pci0000:85", "resource.kubernetes.io/pciBusID": "0000:86:00.0"} {
		if got := str(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	if a := d.Attributes["numaNode"]; a.IntValue == nil || *a.IntValue != 1 {
		t.Errorf("numaNode %+v", a)
	}
	if a := d.Attributes["version"]; a.VersionValue == nil || *a.VersionValue != "1.2.3" {
		t.Errorf("version %+v", a)
	}
	c := d.Capacity[CapacityVConns]
	if c.Value.Value() != 64 || c.RequestPolicy == nil || c.RequestPolicy.Default.Value() != 1 || !ptr.Deref(d.AllowMultipleAllocations, false) {
		t.Errorf("capacity %+v, allowMultipleAllocations %v", c, d.AllowMultipleAllocations)
	}
	// Unknown NUMA node and PCI location: no such attributes.
	soft := Endpoint{Name: "soft", Transport: "UDP", LinkLayer: "Ethernet", NUMANode: -1, VConns: 8}.device("1.2.3")
	for _, k := range []string{"numaNode", "resource.kubernetes.io/numaNode", "pciRoot", "resource.kubernetes.io/pcieRoot", "gid"} {
		if _, ok := soft.Attributes[resourceQN(k)]; ok {
			t.Errorf("the soft device has %s", k)
		}
	}
}

func TestDNSLabel(t *testing.T) {
	for in, want := range map[string]string{"mlx5_0": "mlx5-0", "rxe0": "rxe0", "MLX5_BOND_0": "mlx5-bond-0", "_": "rdma",
		"a234567890123456789012345678901234567890123456789012345678901234567890": "a23456789012345678901234567890123456789012345678901234567890123"} {
		if got := dnsLabel(in); got != want {
			t.Errorf("dnsLabel(%q) = %q, want %q", in, got, want)
		}
	}
}

func resourceQN(s string) resourceapi.QualifiedName { return resourceapi.QualifiedName(s) }

// Any RDMA device name makes a valid DRA device name.
func FuzzDNSLabel(f *testing.F) {
	for _, s := range []string{"mlx5_0", "soft-10.0.0.1:4791", "", "_", "ÄÖ", "rxe0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if l := dnsLabel(s); len(validation.IsDNS1123Label(l)) != 0 {
			t.Fatalf("dnsLabel(%q) = %q: %v", s, l, validation.IsDNS1123Label(l))
		}
	})
}

// An agent serving two rails (multi-rail) is two devices, each with its
// rail, its NUMA node and an even share of the node's vconns (the first
// the remainder); with fewer vconns than rails, only rails with one.
func TestEndpointsRails(t *testing.T) {
	rails, err := rdmadev.List(rdmadevtest.TwoNUMA(t), rdmadev.Names)
	if err != nil {
		t.Fatal(err)
	}
	st := admin.Status{Device: "mlx5_0", GID: "fe80::1", Capacity: 9,
		Rails: []admin.Rail{{Device: "mlx5_0", GID: "fe80::1"}, {Device: "mlx5_1", GID: "fe80::2"}}}
	got := Endpoints(st, rails)
	if len(got) != 2 || got[0].Name != "mlx5-0" || got[0].Rail != 0 || got[0].NUMANode != 0 || got[0].VConns != 5 ||
		got[1].Name != "mlx5-1" || got[1].Rail != 1 || got[1].NUMANode != 1 || got[1].VConns != 4 || got[1].GID != "fe80::2" {
		t.Errorf("Endpoints = %+v", got)
	}
	if r := got[1].device("1.2.3").Attributes["rail"]; r.IntValue == nil || *r.IntValue != 1 {
		t.Errorf("rail attribute %+v, want 1", r)
	}
	st.Capacity = 1
	if got := Endpoints(st, rails); len(got) != 1 || got[0].VConns != 1 || got[0].Rail != 0 {
		t.Errorf("one vconn over two rails: %+v", got)
	}
	soft := admin.Status{Device: "soft-10.0.0.1", Capacity: 4, Rails: []admin.Rail{{Device: "soft-10.0.0.1"}, {Device: "soft-10.0.1.1"}}}
	if got := Endpoints(soft, nil); len(got) != 2 || got[0].Name != "soft" || got[1].Name != "soft-1" {
		t.Errorf("two soft rails: %+v", got)
	}
}
