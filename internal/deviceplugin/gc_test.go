package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

type fakePods struct {
	held [][]string
	err  error
}

// Devices reports the i-th held slice as pod default/p<i>'s.
func (f *fakePods) Devices(context.Context, string) ([]Held, error) {
	out := make([]Held, len(f.held))
	for i, ids := range f.held {
		out[i] = Held{Pod: fmt.Sprintf("default/p%d", i), IDs: ids}
	}
	return out, f.err
}

func TestCollect(t *testing.T) {
	live, gone := ids(0, 1), ids(2)
	for _, tc := range []struct {
		name    string
		pods    *fakePods
		before  []string // allocation ids in the agent
		deleted []string
		after   []string
		err     bool
		bound   map[string]string // allocation -> the pod it is bound to after
	}{
		{name: "gone pod collected, live and foreign kept",
			pods:    &fakePods{held: [][]string{live}},
			before:  []string{AllocationID(&testKey, live), AllocationID(&testKey, gone), "other"},
			deleted: []string{AllocationID(&testKey, gone)},
			after:   slices.Sorted(slices.Values([]string{AllocationID(&testKey, live), "other"})),
			bound:   map[string]string{AllocationID(&testKey, live): "default/p0", "other": ""}},
		{name: "pod resources unreachable: nothing deleted",
			pods:   &fakePods{err: errors.New("connection refused")},
			before: []string{AllocationID(&testKey, gone)},
			after:  []string{AllocationID(&testKey, gone)},
			err:    true},
		{name: "lost allocation of a live pod re-created",
			pods:  &fakePods{held: [][]string{live, {"vconn-9999"}}},
			after: []string{AllocationID(&testKey, live)},
			bound: map[string]string{AllocationID(&testKey, live): "default/p0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fa := newFakeAgent("/run/rv", 8)
			for _, id := range tc.before {
				fa.Allocs[id] = admin.Allocation{ID: id, VConns: 1}
			}
			p := testPlugin(t, fa, false)
			p.opts.PodResources = tc.pods
			deleted, err := p.collect(context.Background())
			if (err != nil) != tc.err {
				t.Fatalf("collect: %v, want error %v", err, tc.err)
			}
			if !slices.Equal(deleted, tc.deleted) {
				t.Errorf("deleted %v, want %v", deleted, tc.deleted)
			}
			if got := fa.IDs(); !slices.Equal(got, tc.after) {
				t.Errorf("allocations %v, want %v", got, tc.after)
			}
			for id, pod := range tc.bound {
				if got := fa.Allocs[id].Pod; got != pod {
					t.Errorf("allocation %s bound to pod %q, want %q", id, got, pod)
				}
			}
		})
	}
}
