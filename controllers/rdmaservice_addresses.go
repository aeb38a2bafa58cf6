package controllers

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
)

// ReasonAddressConflict: two of a service's RDMANodes list one address
// (an agent address or a device's GID). Each agent writes its own
// RDMANode and could write anything there: the agents trust no listing
// that another contests (agent.listedOwner), and the operator says so
// here, so that the node that lied, or a misconfigured one, is found.
const ReasonAddressConflict = "AddressConflict"

// addressConflicts lists each address two or more of nodes list, with
// their names: "address 10.0.0.2 listed by node-b, node-x".
func addressConflicts(nodes map[string]*v1alpha1.RDMANode) []string {
	claims := map[netip.Addr][]string{}
	for name, rn := range nodes {
		if rn == nil {
			continue
		}
		for _, a := range listedAddresses(rn) {
			if !slices.Contains(claims[a], name) {
				claims[a] = append(claims[a], name)
			}
		}
	}
	var out []string
	for a, names := range claims {
		if len(names) > 1 {
			slices.Sort(names)
			out = append(out, fmt.Sprintf("address %s listed by %s", a, strings.Join(names, ", ")))
		}
	}
	slices.Sort(out)
	return out
}

// listedAddresses are the addresses rn's agent says are its own: its
// control address and its devices' GIDs.
func listedAddresses(rn *v1alpha1.RDMANode) []netip.Addr {
	var out []netip.Addr
	add := func(s string) {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	if rn.Status.Address != nil {
		add(rn.Status.Address.IP)
	}
	for _, d := range rn.Status.Devices {
		add(d.GID)
	}
	return out
}
