package deviceplugin

import (
	"context"
	"fmt"
	"strings"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// AdminAgent is the admin.Agent behind the admin socket at Path, an
// admin.RailAgent too. It connects for every request, so an agent restart
// needs no reconnection logic.
type AdminAgent struct{ Path string }

var _ interface {
	admin.Agent
	admin.RailAgent
} = AdminAgent{}

func (a AdminAgent) with(ctx context.Context, f func(*admin.Client) error) error {
	c, err := admin.Dial(ctx, a.Path)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// Status reports the agent's state.
func (a AdminAgent) Status(ctx context.Context) (st admin.Status, err error) {
	err = a.with(ctx, func(c *admin.Client) (err error) { st, err = c.Status(ctx); return err })
	return st, err
}

// CreateAllocation creates an allocation of k vconns for a pod: the agent
// lets it listen and dial only as its pod, once BindAllocation names it.
func (a AdminAgent) CreateAllocation(ctx context.Context, id string, k int) (al admin.Allocation, err error) {
	err = a.with(ctx, func(c *admin.Client) (err error) {
		al, err = c.Create(ctx, admin.Allocation{ID: id, VConns: k, PodScoped: true})
		return err
	})
	return al, err
}

// CreateRailAllocation is CreateAllocation bound to the agent's rail
// (multi-rail: its device of that index).
func (a AdminAgent) CreateRailAllocation(ctx context.Context, id string, k, rail int) (al admin.Allocation, err error) {
	err = a.with(ctx, func(c *admin.Client) (err error) {
		al, err = c.Create(ctx, admin.Allocation{ID: id, VConns: k, PodScoped: true, Rail: rail})
		return err
	})
	return al, err
}

// BindAllocation names the pod ("namespace/name") an allocation is for.
func (a AdminAgent) BindAllocation(ctx context.Context, id, pod string) error {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok {
		return fmt.Errorf("bind allocation %s: pod %q: want namespace/name", id, pod)
	}
	return a.with(ctx, func(c *admin.Client) error { return c.BindAllocation(ctx, id, ns, name) })
}

// DeleteAllocation deletes an allocation.
func (a AdminAgent) DeleteAllocation(ctx context.Context, id string) error {
	return a.with(ctx, func(c *admin.Client) error { return c.DeleteAllocation(ctx, id) })
}

// ListAllocations lists the allocations.
func (a AdminAgent) ListAllocations(ctx context.Context) (als []admin.Allocation, err error) {
	err = a.with(ctx, func(c *admin.Client) (err error) { als, err = c.ListAllocations(ctx); return err })
	return als, err
}
