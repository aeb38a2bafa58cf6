//go:build ibverbs

package device

import (
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/ibv"
)

// openIBVerbs opens the first RDMA device the selector accepts, addressed
// by a RoCE v2 GID when it has one (ibv.Open says how).
func openIBVerbs(d config.DeviceConfig) (verbs.Device, error) {
	dev, err := ibv.Open(ibv.Config{Names: d.Names, Vendors: d.Vendors, Port: d.Port, GIDIndex: d.GIDIndex})
	if err != nil {
		return nil, classifyIBVerbs(err)
	}
	return dev, nil
}
