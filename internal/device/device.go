// Package device opens a node agent's RDMA device for its configuration:
// the software provider on UDP, or libibverbs in binaries built with the
// ibverbs tag. The commands that run agents wire it in
// (agent.Options.OpenDevice); the agent itself chooses no provider.
package device

import (
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
)

// Open opens the node's RDMA device with the configured provider: the
// software one on UDP, bound to the node IP, or libibverbs when the binary
// is built with -tags ibverbs. The caller (the agent) owns the device.
// An error is an *OpenError, whose Reason says which class of failure it
// is (no such device, port down, GID index out of range, ...).
func Open(cfg *config.AgentConfig) (verbs.Device, error) {
	switch cfg.Device.Provider {
	case config.ProviderSoft:
		dev, err := soft.OpenUDP(cfg.Soft.BindAddress, cfg.Soft.UDPPort)
		if err != nil {
			return nil, &OpenError{reason: ReasonOpenFailed, Err: err}
		}
		return dev, nil
	case config.ProviderIBVerbs:
		return openIBVerbs(cfg.Device)
	}
	return nil, &OpenError{reason: ReasonInvalidRequest, Err: fmt.Errorf("device provider %q: want soft or ibverbs", cfg.Device.Provider)}
}
