package main

import (
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
)

// openDevice opens the node's RDMA device with the configured provider:
// the software one on UDP, bound to the node IP, or libibverbs when the
// binary is built with -tags ibverbs. The agent owns the device.
func openDevice(cfg *config.AgentConfig) (verbs.Device, error) {
	switch cfg.Device.Provider {
	case config.ProviderSoft:
		return soft.OpenUDP(cfg.Soft.BindAddress, cfg.Soft.UDPPort)
	case config.ProviderIBVerbs:
		return openIBVerbs(cfg.Device)
	}
	return nil, fmt.Errorf("device provider %q: want soft or ibverbs", cfg.Device.Provider)
}
