package dra

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/utils/ptr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
)

// CapacityVConns is the consumable capacity of a device: vconns of the
// agent's quota.
const CapacityVConns resourceapi.QualifiedName = "vconns"

// Endpoint is an RDMA endpoint the agent serves: one DRA device.
type Endpoint struct {
	// Name is the DRA device's name, a DNS label made of DeviceName.
	Name string
	// DeviceName is the RDMA device ("mlx5_0"), or the soft provider's.
	DeviceName string
	// Transport is RoCE, InfiniBand, or UDP (the soft provider).
	Transport string
	LinkLayer string
	GID       string
	// NUMANode is -1 where unknown; PCIRoot and PCIAddress are empty for a
	// software device.
	NUMANode            int
	PCIRoot, PCIAddress string
	VConns              int
	// Rail is the agent's rail the device is (multi-rail): a claim's
	// allocation is bound to it.
	Rail int
	// Down says why the rail cannot carry vconns (admin.Rail.Down); empty
	// while it is up. A device that is down is not published.
	Down string
}

// Endpoints are the endpoints of an agent in status st: the device it
// opened, or one per rail when it serves several (multi-rail: each with
// an even share of the node's vconns, the first the remainder, since the
// agent's quota is the node's), located by the rails sysfs lists
// (package rdmadev); a device sysfs does not list is the soft provider's.
// None while the agent names no device. A rail that is down is still an
// endpoint, with its reason (Down): its device is not published, but its
// health is reported.
func Endpoints(st admin.Status, rails []rdmadev.Device) []Endpoint {
	if st.Device == "" || st.Capacity < 1 {
		return nil
	}
	if len(st.Rails) <= 1 {
		ep := endpoint(st.Device, st.GID, st.Capacity, 0, rails)
		if len(st.Rails) == 1 {
			ep.Down = st.Rails[0].Down
		}
		return []Endpoint{ep}
	}
	n := len(st.Rails)
	if st.Capacity < n {
		n = st.Capacity // a rail without a vconn to offer is not published
	}
	eps := make([]Endpoint, 0, n)
	for i, r := range st.Rails[:n] {
		k := st.Capacity / n
		if i == 0 {
			k += st.Capacity % n
		}
		ep := endpoint(r.Device, r.GID, k, i, rails)
		ep.Down = r.Down
		if ep.Name == "soft" && i > 0 {
			ep.Name = fmt.Sprintf("soft-%d", i)
		}
		eps = append(eps, ep)
	}
	return eps
}

// endpoint is the endpoint of device, the agent's rail, with k vconns.
func endpoint(device, gid string, k, rail int, rails []rdmadev.Device) Endpoint {
	ep := Endpoint{Name: dnsLabel(device), DeviceName: device, Transport: "UDP", LinkLayer: string(rdmadev.Ethernet),
		GID: gid, NUMANode: -1, VConns: k, Rail: rail}
	for _, r := range rails {
		if r.Name != device {
			continue
		}
		ep.NUMANode, ep.PCIRoot, ep.PCIAddress = r.NUMANode, r.PCIRoot, r.PCIAddress
		ep.Transport, ep.LinkLayer = "RoCE", string(rdmadev.Ethernet)
		if len(r.Ports) > 0 {
			// The agent opens port 1 unless configured otherwise, and all
			// ports of a device share its link layer in practice.
			ep.Transport, ep.LinkLayer = r.Ports[0].Transport(), string(r.Ports[0].LinkLayer)
		}
	}
	if strings.HasPrefix(device, "soft-") {
		ep.Name = "soft"
	}
	return ep
}

// dnsLabel makes a DRA device name of an RDMA device name: lower case,
// '-' for anything but letters and digits, at most 63 characters.
func dnsLabel(s string) string {
	b := []byte(strings.ToLower(s))
	for i, c := range b {
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9') {
			b[i] = '-'
		}
	}
	out := strings.Trim(string(b), "-")
	if len(out) > 63 {
		out = strings.TrimRight(out[:63], "-")
	}
	if out == "" {
		return "rdma"
	}
	return out
}

// device is the DRA device of an endpoint.
func (e Endpoint) device(version string) resourceapi.Device {
	str := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"transport":  str(e.Transport),
		"linkLayer":  str(e.LinkLayer),
		"deviceName": str(e.DeviceName),
		"version":    {VersionValue: ptr.To(version)},
		"rail":       {IntValue: ptr.To(int64(e.Rail))},
	}
	if e.GID != "" {
		attrs["gid"] = str(e.GID)
	}
	if e.NUMANode >= 0 {
		attrs["numaNode"] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(e.NUMANode))}
		attrs[deviceattribute.StandardDeviceAttributeNUMANode] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(e.NUMANode))}
	}
	if e.PCIRoot != "" {
		attrs["pciRoot"] = str(e.PCIRoot)
		attrs[deviceattribute.StandardDeviceAttributePCIeRoot] = str(e.PCIRoot)
	}
	if e.PCIAddress != "" {
		attrs[deviceattribute.StandardDeviceAttributePCIBusID] = str(e.PCIAddress)
	}
	one := resource.MustParse("1")
	return resourceapi.Device{
		Name:       e.Name,
		Attributes: attrs,
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			CapacityVConns: {
				Value: *resource.NewQuantity(int64(e.VConns), resource.DecimalSI),
				// A request that names no vconns takes one, not the
				// whole device.
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    &one,
					ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &one, Step: &one},
				},
			},
		},
		AllowMultipleAllocations: ptr.To(true),
	}
}
