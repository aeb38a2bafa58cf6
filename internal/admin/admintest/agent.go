// Package admintest is a node agent in memory for the tests of the
// agent's clients (admin.Agent: the device plugin, the DRA driver).
package admintest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// ErrDown is what a down Agent's requests fail with.
var ErrDown = errors.New("fake agent: connection refused")

// Agent is an admin.RailAgent in memory. Its fields are what it reports and
// holds; a test that changes them while the agent is in use holds its lock
// (Lock, Unlock).
type Agent struct {
	sync.Mutex

	// Dir is the agent's socket directory: an allocation's socket is
	// <Dir>/alloc/<id>/admin.SocketName; none if Dir is empty.
	Dir string
	// Capacity is the vconns the allocations may hold together.
	Capacity int
	// MaxVConns, if set, is the most one allocation may hold, as the
	// agent's configuration bounds them.
	MaxVConns int
	// Down makes every request but BindAllocation fail with ErrDown.
	Down bool
	// Ready is what Status reports.
	Ready bool
	// Device and GID are the RDMA device and GID Status reports; with a
	// GID, each rail reports fe80::<its index + 1>.
	Device, GID string
	// Rails are the devices of its rails (multi-rail), if several.
	Rails []string
	// RailDown is why each rail is down ("" up), as Status reports and
	// an allocation on it is refused; nil: all up.
	RailDown []string
	// RailOf is the rail of each allocation made on one
	// (CreateRailAllocation).
	RailOf map[string]int
	// Allocs are the allocations, by id.
	Allocs map[string]admin.Allocation
}

var _ interface {
	admin.Agent
	admin.RailAgent
} = (*Agent)(nil)

// New is a ready Agent of capacity vconns, with no allocations.
func New(capacity int) *Agent {
	return &Agent{Capacity: capacity, Ready: true, Allocs: make(map[string]admin.Allocation)}
}

// Status reports the agent's state.
func (a *Agent) Status(context.Context) (admin.Status, error) {
	a.Lock()
	defer a.Unlock()
	if a.Down {
		return admin.Status{}, ErrDown
	}
	st := admin.Status{Ready: a.Ready, Capacity: a.Capacity, Device: a.Device, GID: a.GID}
	for i, r := range a.Rails {
		rail := admin.Rail{Device: r, Down: a.downOf(i)}
		if a.GID != "" {
			rail.GID = fmt.Sprintf("fe80::%d", i+1)
		}
		st.Rails = append(st.Rails, rail)
	}
	return st, nil
}

// downOf is why rail i is down; a's lock held.
func (a *Agent) downOf(i int) string {
	if i < len(a.RailDown) {
		return a.RailDown[i]
	}
	return ""
}

// CreateRailAllocation creates an allocation bound to rail.
func (a *Agent) CreateRailAllocation(_ context.Context, id string, k, rail int) (admin.Allocation, error) {
	al, err := a.create(id, k, rail)
	if err == nil {
		a.Lock()
		if a.RailOf == nil {
			a.RailOf = make(map[string]int)
		}
		a.RailOf[id] = rail
		a.Unlock()
	}
	return al, err
}

// CreateAllocation creates an allocation on rail 0.
func (a *Agent) CreateAllocation(_ context.Context, id string, k int) (admin.Allocation, error) {
	return a.create(id, k, 0)
}

func (a *Agent) create(id string, k, rail int) (admin.Allocation, error) {
	a.Lock()
	defer a.Unlock()
	if a.Down {
		return admin.Allocation{}, ErrDown
	}
	if why := a.downOf(rail); why != "" { // as the agent refuses
		return admin.Allocation{}, &admin.Error{Code: admin.CodeInvalid, Message: fmt.Sprintf("rail %d is down: %s", rail, why)}
	}
	if _, ok := a.Allocs[id]; ok {
		return admin.Allocation{}, &admin.Error{Code: admin.CodeExists, Message: id}
	}
	if a.MaxVConns > 0 && k > a.MaxVConns {
		return admin.Allocation{}, &admin.Error{Code: admin.CodeInvalid, Message: fmt.Sprintf("at most %d vconns", a.MaxVConns)}
	}
	used := k
	for _, al := range a.Allocs {
		used += al.VConns
	}
	if used > a.Capacity {
		return admin.Allocation{}, &admin.Error{Code: admin.CodeQuota, Message: id}
	}
	al := admin.Allocation{ID: id, VConns: k}
	if a.Dir != "" {
		al.Socket = filepath.Join(a.Dir, "alloc", id, admin.SocketName)
	}
	a.Allocs[id] = al
	return al, nil
}

// BindAllocation names the pod an allocation is for.
func (a *Agent) BindAllocation(_ context.Context, id, pod string) error {
	a.Lock()
	defer a.Unlock()
	al, ok := a.Allocs[id]
	if !ok {
		return &admin.Error{Code: admin.CodeNotFound, Message: id}
	}
	al.Pod = pod
	a.Allocs[id] = al
	return nil
}

// DeleteAllocation deletes an allocation.
func (a *Agent) DeleteAllocation(_ context.Context, id string) error {
	a.Lock()
	defer a.Unlock()
	if a.Down {
		return ErrDown
	}
	if _, ok := a.Allocs[id]; !ok {
		return &admin.Error{Code: admin.CodeNotFound, Message: id}
	}
	delete(a.Allocs, id)
	return nil
}

// ListAllocations lists the allocations.
func (a *Agent) ListAllocations(context.Context) ([]admin.Allocation, error) {
	a.Lock()
	defer a.Unlock()
	if a.Down {
		return nil, ErrDown
	}
	return slices.Collect(maps.Values(a.Allocs)), nil
}

// Get returns allocation id, if any.
func (a *Agent) Get(id string) (admin.Allocation, bool) {
	a.Lock()
	defer a.Unlock()
	al, ok := a.Allocs[id]
	return al, ok
}

// IDs are the allocations' ids, sorted.
func (a *Agent) IDs() []string {
	a.Lock()
	defer a.Unlock()
	return slices.Sorted(maps.Keys(a.Allocs))
}
