package deviceplugin

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// devicePrefix starts every device ID.
const devicePrefix = "vconn-"

// allocPrefix starts the id of every allocation the device plugin makes;
// garbage collection touches only these.
const allocPrefix = "dp-"

// DeviceID is the ID of device i: vconn-0000, vconn-0001...
func DeviceID(i int) string { return fmt.Sprintf("%s%04d", devicePrefix, i) }

// deviceIndex parses a device ID of n devices; ok is false for an ID the
// plugin does not advertise.
func deviceIndex(id string, n int) (int, bool) {
	s, ok := strings.CutPrefix(id, devicePrefix)
	if !ok || len(s) < 4 || (len(s) > 4 && s[0] == '0') {
		return 0, false
	}
	i, err := strconv.Atoi(s)
	if err != nil || i < 0 || i >= n || DeviceID(i) != id {
		return 0, false
	}
	return i, true
}

// checkDevices validates the device IDs of one container of n advertised
// devices.
func checkDevices(ids []string, n int) error {
	if len(ids) == 0 {
		return fmt.Errorf("no devices requested")
	}
	if len(ids) > n {
		return fmt.Errorf("%d devices requested, %d advertised", len(ids), n)
	}
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if _, ok := deviceIndex(id, n); !ok {
			return fmt.Errorf("unknown device %q (devices are %s..%s)", id, DeviceID(0), DeviceID(n-1))
		}
		if seen[id] {
			return fmt.Errorf("device %q requested twice", id)
		}
		seen[id] = true
	}
	return nil
}

// preferred chooses size devices among available, with must included:
// must first, then the lowest-starting run of contiguous available
// devices long enough for the rest, else the lowest available IDs. IDs it
// does not know are ignored. The result is sorted by index.
func preferred(available, must []string, size, n int) []string {
	chosen := make(map[int]bool)
	for _, id := range must {
		if i, ok := deviceIndex(id, n); ok {
			chosen[i] = true
		}
	}
	var free []int
	for _, id := range available {
		if i, ok := deviceIndex(id, n); ok && !chosen[i] {
			free = append(free, i)
		}
	}
	slices.Sort(free)
	free = slices.Compact(free)
	need := size - len(chosen)
	if need > len(free) {
		need = len(free)
	}
	if need > 0 {
		start := -1
		for i := 0; i+need <= len(free); i++ {
			if free[i+need-1]-free[i] == need-1 {
				start = i
				break
			}
		}
		if start < 0 {
			start = 0
		}
		for _, i := range free[start : start+need] {
			chosen[i] = true
		}
	}
	idx := make([]int, 0, len(chosen))
	for i := range chosen {
		idx = append(idx, i)
	}
	slices.Sort(idx)
	out := make([]string, len(idx))
	for k, i := range idx {
		out[k] = DeviceID(i)
	}
	return out
}
