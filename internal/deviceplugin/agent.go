package deviceplugin

import (
	"context"

	"github.com/rdmavisor/rdmavisor/internal/agent"
)

// Agent is what the plugin needs of the node agent: the boundary tests
// replace with a fake. Errors of the admin protocol match agent.ErrExists,
// agent.ErrNotFound and agent.ErrQuota with errors.Is.
type Agent interface {
	Status(ctx context.Context) (agent.Status, error)
	CreateAllocation(ctx context.Context, id string, k int) (agent.Allocation, error)
	DeleteAllocation(ctx context.Context, id string) error
	ListAllocations(ctx context.Context) ([]agent.Allocation, error)
}

// AdminAgent is the Agent behind the admin socket at Path. It connects
// for every request, so an agent restart needs no reconnection logic.
type AdminAgent struct{ Path string }

var _ Agent = AdminAgent{}

func (a AdminAgent) with(ctx context.Context, f func(*agent.AdminClient) error) error {
	c, err := agent.DialAdmin(ctx, a.Path)
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// Status reports the agent's state.
func (a AdminAgent) Status(ctx context.Context) (st agent.Status, err error) {
	err = a.with(ctx, func(c *agent.AdminClient) (err error) { st, err = c.Status(ctx); return err })
	return st, err
}

// CreateAllocation creates an allocation of k vconns.
func (a AdminAgent) CreateAllocation(ctx context.Context, id string, k int) (al agent.Allocation, err error) {
	err = a.with(ctx, func(c *agent.AdminClient) (err error) { al, err = c.CreateAllocation(ctx, id, k); return err })
	return al, err
}

// DeleteAllocation deletes an allocation.
func (a AdminAgent) DeleteAllocation(ctx context.Context, id string) error {
	return a.with(ctx, func(c *agent.AdminClient) error { return c.DeleteAllocation(ctx, id) })
}

// ListAllocations lists the allocations.
func (a AdminAgent) ListAllocations(ctx context.Context) (als []agent.Allocation, err error) {
	err = a.with(ctx, func(c *agent.AdminClient) (err error) { als, err = c.ListAllocations(ctx); return err })
	return als, err
}
