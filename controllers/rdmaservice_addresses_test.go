package controllers

import (
	"slices"
	"testing"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// TestAddressConflicts: an address (agent address or device GID) that two
// RDMANodes list is reported with both names, once however many times each
// lists it; IPv4-mapped and plain IPv4 are one address; nodes that list
// their own addresses only report nothing.
func TestAddressConflicts(t *testing.T) {
	node := func(ip string, gids ...string) *v1alpha1.RDMANode {
		rn := &v1alpha1.RDMANode{}
		rn.Status.Address = &v1alpha1.AgentAddress{IP: ip, ControlPort: 7471}
		for _, g := range gids {
			rn.Status.Devices = append(rn.Status.Devices, v1alpha1.RDMADevice{GID: g})
		}
		return rn
	}
	clean := map[string]*v1alpha1.RDMANode{"node-a": node("10.0.0.1", "10.0.0.1"), "node-b": node("10.0.0.2", "10.0.0.2", "10.1.0.2"), "node-c": nil}
	if got := addressConflicts(clean); len(got) != 0 {
		t.Errorf("own addresses only: %v, want none", got)
	}
	liar := map[string]*v1alpha1.RDMANode{"node-a": node("10.0.0.1", "10.0.0.1"), "node-b": node("10.0.0.2", "10.0.0.2"),
		"node-x": node("10.0.0.9", "10.0.0.9", "::ffff:10.0.0.2", "10.0.0.1")}
	want := []string{"address 10.0.0.1 listed by node-a, node-x", "address 10.0.0.2 listed by node-b, node-x"}
	if got := addressConflicts(liar); !slices.Equal(got, want) {
		t.Errorf("node-x listing node-a's and node-b's addresses: %v, want %v", got, want)
	}
}
