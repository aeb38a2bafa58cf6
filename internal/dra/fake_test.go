package dra

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// fakeAgent is an Agent in memory, of capacity vconns.
type fakeAgent struct {
	mu       sync.Mutex
	capacity int
	device   string
	down     bool
	allocs   map[string]admin.Allocation
	rails    []string       // the devices of its rails (multi-rail), if several
	railDown []string       // why each rail is down ("" up), as Status reports; nil: all up
	railOf   map[string]int // the rail of each allocation made on one
}

var errDown = errors.New("fake agent: connection refused")

func newFakeAgent(capacity int) *fakeAgent {
	return &fakeAgent{capacity: capacity, device: "mlx5_1", allocs: make(map[string]admin.Allocation)}
}

func (f *fakeAgent) Status(context.Context) (admin.Status, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return admin.Status{}, errDown
	}
	st := admin.Status{Ready: true, Capacity: f.capacity, Device: f.device, GID: "fe80::c42:a103:65:7b20"}
	for i, r := range f.rails {
		st.Rails = append(st.Rails, admin.Rail{Device: r, GID: fmt.Sprintf("fe80::%d", i+1), Down: f.downOf(i)})
	}
	return st, nil
}

// downOf is why rail i is down; f.mu held.
func (f *fakeAgent) downOf(i int) string {
	if i < len(f.railDown) {
		return f.railDown[i]
	}
	return ""
}

func (f *fakeAgent) CreateRailAllocation(_ context.Context, id string, k, rail int) (admin.Allocation, error) {
	al, err := f.create(id, k, rail)
	if err == nil {
		f.mu.Lock()
		if f.railOf == nil {
			f.railOf = make(map[string]int)
		}
		f.railOf[id] = rail
		f.mu.Unlock()
	}
	return al, err
}

func (f *fakeAgent) CreateAllocation(_ context.Context, id string, k int) (admin.Allocation, error) {
	return f.create(id, k, 0)
}

func (f *fakeAgent) create(id string, k, rail int) (admin.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return admin.Allocation{}, errDown
	}
	if why := f.downOf(rail); why != "" { // as the agent refuses
		return admin.Allocation{}, &admin.Error{Code: admin.CodeInvalid, Message: fmt.Sprintf("rail %d is down: %s", rail, why)}
	}
	if _, ok := f.allocs[id]; ok {
		return admin.Allocation{}, &admin.Error{Code: "exists", Message: id}
	}
	used := k
	for _, al := range f.allocs {
		used += al.VConns
	}
	if used > f.capacity {
		return admin.Allocation{}, &admin.Error{Code: "quota", Message: id}
	}
	f.allocs[id] = admin.Allocation{ID: id, VConns: k}
	return f.allocs[id], nil
}

func (f *fakeAgent) BindAllocation(_ context.Context, id, pod string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	al, ok := f.allocs[id]
	if !ok {
		return &admin.Error{Code: "notFound", Message: id}
	}
	al.Pod = pod
	f.allocs[id] = al
	return nil
}

func (f *fakeAgent) DeleteAllocation(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return errDown
	}
	if _, ok := f.allocs[id]; !ok {
		return &admin.Error{Code: "notFound", Message: id}
	}
	delete(f.allocs, id)
	return nil
}

func (f *fakeAgent) ListAllocations(context.Context) ([]admin.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.down {
		return nil, errDown
	}
	return slices.Collect(maps.Values(f.allocs)), nil
}

// get returns allocation id, if any.
func (f *fakeAgent) get(id string) (admin.Allocation, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	al, ok := f.allocs[id]
	return al, ok
}

func (f *fakeAgent) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.allocs))
}
