package deviceplugin

import (
	"slices"
	"testing"
)

func TestDeviceIndex(t *testing.T) {
	for _, tc := range []struct {
		id string
		n  int
		i  int
		ok bool
	}{
		{"vconn-0000", 4, 0, true},
		{"vconn-0003", 4, 3, true},
		{"vconn-0004", 4, 0, false},
		{"vconn-12345", 20000, 12345, true},
		{"vconn-012345", 20000, 0, false},
		{"vconn-3", 4, 0, false},
		{"vconn--001", 4, 0, false},
		{"gpu-0000", 4, 0, false},
		{"", 4, 0, false},
	} {
		i, ok := deviceIndex(tc.id, tc.n)
		if i != tc.i || ok != tc.ok {
			t.Errorf("deviceIndex(%q, %d) = %d, %v; want %d, %v", tc.id, tc.n, i, ok, tc.i, tc.ok)
		}
	}
}

func TestCheckDevices(t *testing.T) {
	for _, tc := range []struct {
		name string
		ids  []string
		ok   bool
	}{
		{"one", []string{"vconn-0000"}, true},
		{"all", []string{"vconn-0000", "vconn-0001", "vconn-0002", "vconn-0003"}, true},
		{"none", nil, false},
		{"unknown", []string{"vconn-0009"}, false},
		{"duplicate", []string{"vconn-0001", "vconn-0001"}, false},
		{"too many", []string{"vconn-0000", "vconn-0001", "vconn-0002", "vconn-0003", "vconn-0000"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := checkDevices(tc.ids, 4); (err == nil) != tc.ok {
				t.Errorf("checkDevices(%v) = %v, want ok=%v", tc.ids, err, tc.ok)
			}
		})
	}
}

func ids(is ...int) []string {
	out := make([]string, len(is))
	for k, i := range is {
		out[k] = DeviceID(i)
	}
	return out
}

func TestPreferred(t *testing.T) {
	for _, tc := range []struct {
		name      string
		available []string
		must      []string
		size      int
		want      []string
	}{
		{"lowest", ids(5, 1, 0, 2), nil, 2, ids(0, 1)},
		{"contiguous run over lowest", ids(0, 2, 4, 5, 6), nil, 3, ids(4, 5, 6)},
		{"no run: lowest", ids(0, 2, 4, 6), nil, 3, ids(0, 2, 4)},
		{"must first", ids(0, 1, 2, 3, 7), ids(7), 3, ids(0, 1, 7)},
		{"must only", ids(0, 1, 3), ids(3), 1, ids(3)},
		{"fewer available", ids(1), nil, 3, ids(1)},
		{"unknown ignored", []string{"x", "vconn-0099", DeviceID(2), DeviceID(3)}, nil, 2, ids(2, 3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := preferred(tc.available, tc.must, tc.size, 8)
			if !slices.Equal(got, tc.want) {
				t.Errorf("preferred = %v, want %v", got, tc.want)
			}
		})
	}
}
