package deviceplugin

import (
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
)

// topology is where the n advertised devices are: the NUMA node of the
// rail serving each. With one rail it is known at once; with several it
// waits for the agent to name the devices it opened (learn). An agent
// that serves several rails (multi-rail) serves the devices in contiguous
// blocks, one a rail, and an allocation goes to the rail of most of its
// devices (railOf).
type topology struct {
	n     int
	rails []rdmadev.Device

	mu      sync.Mutex
	serving string // the rails the agent names, joined; guarded by mu
	numa    []int  // per advertised device; nil: unknown; guarded by mu
	count   int    // how many rails the agent serves (0: not known yet); guarded by mu
}

func newTopology(n int, rails []rdmadev.Device) *topology {
	t := &topology{n: n, rails: rails}
	if len(rails) == 1 {
		t.serving, t.numa = rails[0].Name, numaOf(n, rails)
	}
	return t
}

// nodes is the NUMA node of each advertised device, or nil. The caller
// must not modify it.
func (t *topology) nodes() []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.numa
}

// learn places the devices on the rails the agent serves them with, its
// devices in rail order; it reports whether that changed where they are.
// Devices no rail is (the soft provider's, or none yet) place nothing,
// though their count still splits allocations over the rails.
func (t *topology) learn(devices []string) bool {
	var serving []rdmadev.Device
	for _, name := range devices {
		i := slices.IndexFunc(t.rails, func(r rdmadev.Device) bool { return r.Name == name })
		if i < 0 {
			serving = nil
			break
		}
		serving = append(serving, t.rails[i])
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.count = len(devices)
	joined := strings.Join(devices, ",")
	if len(serving) == 0 || t.serving == joined {
		return false
	}
	old := t.numa
	t.serving, t.numa = joined, numaOf(t.n, serving)
	return !slices.Equal(old, t.numa)
}

// railOf returns the rail that serves most of the devices ids (the lowest
// such rail on a tie), the one their allocation is bound to: 0 while the
// agent serves one rail or has not said how many. A rail down says is
// down (see health.down) is chosen only when every rail of the devices
// is: then the agent refuses the allocation.
func (t *topology) railOf(ids []string, down []string) int {
	t.mu.Lock()
	count := t.count
	t.mu.Unlock()
	if count <= 1 {
		return 0
	}
	votes := make([]int, count)
	for _, id := range ids {
		if i, ok := deviceIndex(id, t.n); ok {
			votes[i*count/t.n]++
		}
	}
	best := -1
	for r, v := range votes {
		if v > 0 && railDown(down, r) == "" && (best < 0 || v > votes[best]) {
			best = r
		}
	}
	if best >= 0 {
		return best
	}
	best = 0
	for r, v := range votes {
		if v > votes[best] {
			best = r
		}
	}
	return best
}

// numaOf maps the n advertised devices onto the RDMA devices that serve
// them, in contiguous blocks: device i is served by rails[i*len/n] (one
// rail, or several when the agent serves several: multi-rail). It
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

// Rails lists the RDMA devices under the sysfs root that may serve the
// agent's vconns: none for the soft provider; for ibverbs those the
// configured names accept (all when none are given). Vendors are not
// matched: libibverbs' vendor IDs are not in sysfs. The agent opens one
// of them: the plugin learns which from the agent's status.
func Rails(root string, d config.DeviceConfig) ([]rdmadev.Device, error) {
	if d.Provider != config.ProviderIBVerbs {
		return nil, nil
	}
	devs, err := rdmadev.List(root, rdmadev.Names)
	if err != nil {
		return nil, err
	}
	var out []rdmadev.Device
	for _, dev := range devs {
		if len(d.Names) == 0 || slices.Contains(d.Names, dev.Name) {
			out = append(out, dev)
		}
	}
	return out, nil
}
