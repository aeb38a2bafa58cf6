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

// MaxRails bounds config.DeviceConfig.Rails.
const MaxRails = config.MaxRails

// OpenRails opens the devices of the node's rails (config.DeviceConfig
// Rails), rail 0 first: one device, as Open does, unless more are
// configured. The caller owns the devices; on error none is left open.
func OpenRails(cfg *config.AgentConfig) (_ []verbs.Device, err error) {
	n := max(cfg.Device.Rails, 1)
	if n > MaxRails {
		return nil, &OpenError{reason: ReasonInvalidRequest, Err: fmt.Errorf("device: %d rails: want at most %d", n, MaxRails)}
	}
	if n == 1 {
		dev, err := Open(cfg)
		if err != nil {
			return nil, err
		}
		return []verbs.Device{dev}, nil
	}
	rail := func(i int) *config.AgentConfig {
		c := *cfg
		switch cfg.Device.Provider {
		case config.ProviderSoft:
			if i > 0 {
				c.Soft.BindAddress = cfg.Soft.RailAddresses[i-1]
			}
		case config.ProviderIBVerbs:
			c.Device.Names = []string{cfg.Device.Names[i]}
		}
		return &c
	}
	switch cfg.Device.Provider {
	case config.ProviderSoft:
		if len(cfg.Soft.RailAddresses) != n-1 {
			return nil, &OpenError{reason: ReasonInvalidRequest, Err: fmt.Errorf("device: %d rails of the soft provider need %d soft.railAddresses (rail 0 binds soft.bindAddress), not %d", n, n-1, len(cfg.Soft.RailAddresses))}
		}
	case config.ProviderIBVerbs:
		if len(cfg.Device.Names) < n {
			return nil, &OpenError{reason: ReasonInvalidRequest, Err: fmt.Errorf("device: %d rails of the ibverbs provider need %d device names, one a rail, not %d", n, n, len(cfg.Device.Names))}
		}
	}
	devs := make([]verbs.Device, 0, n)
	defer func() {
		if err != nil {
			for _, d := range devs {
				_ = d.Close()
			}
		}
	}()
	for i := range n {
		dev, err := Open(rail(i))
		if err != nil {
			return nil, fmt.Errorf("device: rail %d: %w", i, err)
		}
		devs = append(devs, dev)
	}
	return devs, nil
}
