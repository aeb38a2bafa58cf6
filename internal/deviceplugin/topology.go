package deviceplugin

import (
	"maps"
	"slices"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
)

// numaOf maps the n advertised devices onto the RDMA devices that serve
// them, in contiguous blocks: device i is served by rails[i*len/n]. It
// returns the NUMA node of each advertised device, or nil when no RDMA
// device knows its node (the soft provider, a single-node machine): then
// the plugin reports no topology.
func numaOf(n int, rails []rdmadev.Device) []int {
	known := false
	for _, r := range rails {
		known = known || r.NUMANode >= 0
	}
	if !known {
		return nil
	}
	numa := make([]int, n)
	for i := range numa {
		numa[i] = rails[i*len(rails)/n].NUMANode
	}
	return numa
}

// preferredNUMA is preferred on one NUMA node: the node of the
// must-include devices when they share one, else the node with the
// fewest available devices that still fits the whole request (best fit:
// it leaves the emptier nodes to larger requests), the lowest such node
// on a tie. What that node cannot give comes from the others, as does
// everything when no single node fits or the must-include devices span
// several. numa nil: preferred.
func preferredNUMA(available, must []string, size, n int, numa []int) []string {
	if numa == nil {
		return preferred(available, must, size, n)
	}
	free := make(map[int][]string) // NUMA node -> available devices on it
	for _, id := range available {
		if i, ok := deviceIndex(id, n); ok {
			free[numa[i]] = append(free[numa[i]], id)
		}
	}
	var mustNodes []int
	for _, id := range must {
		if i, ok := deviceIndex(id, n); ok && !slices.Contains(mustNodes, numa[i]) {
			mustNodes = append(mustNodes, numa[i])
		}
	}
	node, found := 0, false
	switch len(mustNodes) {
	case 0:
		for _, nd := range slices.Sorted(maps.Keys(free)) {
			if len(free[nd]) >= size && (!found || len(free[nd]) < len(free[node])) {
				node, found = nd, true
			}
		}
	case 1:
		node, found = mustNodes[0], true
	}
	if !found {
		return preferred(available, must, size, n)
	}
	chosen := preferred(free[node], must, size, n)
	if len(chosen) < size {
		chosen = preferred(available, chosen, size, n)
	}
	return chosen
}

// Rails lists the RDMA devices under the sysfs root that serve the
// agent's vconns: none for the soft provider; for ibverbs the first
// device the configured names accept (all when none are given), in name
// order, as the agent opens only one device today. Vendors are not
// matched: libibverbs' vendor IDs are not in sysfs.
func Rails(root string, d config.DeviceConfig) ([]rdmadev.Device, error) {
	if d.Provider != config.ProviderIBVerbs {
		return nil, nil
	}
	devs, err := rdmadev.List(root, rdmadev.Names)
	if err != nil {
		return nil, err
	}
	for _, dev := range devs {
		if len(d.Names) == 0 || slices.Contains(d.Names, dev.Name) {
			return []rdmadev.Device{dev}, nil
		}
	}
	return nil, nil
}
