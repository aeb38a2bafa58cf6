package dra

import "github.com/rdmavisor/rdmavisor/internal/admin/admintest"

// newFakeAgent is an agent in memory of capacity vconns, on mlx5_1.
func newFakeAgent(capacity int) *admintest.Agent {
	a := admintest.New(capacity)
	a.Device, a.GID = "mlx5_1", "fe80::c42:a103:65:7b20"
	return a
}
