//go:build ibverbs && linux

package interop

import (
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/ibv"
)

// openIBV opens the guest's rxe0 on its IPv4 RoCE v2 GID.
func openIBV() (verbs.Device, error) { return ibv.Open(ibv.Config{Names: []string{"rxe0"}}) }
