package admin

import "context"

// Agent is what the device plugin and the DRA driver need of the node
// agent: its status and the allocations they make for pods. A Client
// behind a socket (deviceplugin.AdminAgent) is one; their tests use a fake
// (package admintest). Errors of the admin protocol match ErrExists,
// ErrNotFound and ErrQuota with errors.Is.
type Agent interface {
	Status(ctx context.Context) (Status, error)
	CreateAllocation(ctx context.Context, id string, k int) (Allocation, error)
	DeleteAllocation(ctx context.Context, id string) error
	ListAllocations(ctx context.Context) ([]Allocation, error)
	// BindAllocation names the pod ("namespace/name") an allocation is for.
	BindAllocation(ctx context.Context, id, pod string) error
}

// RailAgent is an Agent that binds an allocation to one of its rails
// (multi-rail: its device of that index); allocations on other rails than
// 0 are made through it.
type RailAgent interface {
	CreateRailAllocation(ctx context.Context, id string, k, rail int) (Allocation, error)
}
