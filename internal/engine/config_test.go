package engine

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// limited is a device whose queues are smaller than the soft provider's,
// as rxe's CQs (32,767 entries) are.
type limited struct {
	verbs.Device
	maxCQE, maxQPWR, maxSRQWR int
}

func (d limited) Attr() verbs.DeviceAttr {
	a := d.Device.Attr()
	a.MaxCQE, a.MaxQPWR, a.MaxSRQWR = d.maxCQE, d.maxQPWR, d.maxSRQWR
	return a
}

// softDevice is a soft device of its own fabric, closed when t ends.
func softDevice(t *testing.T, name string) verbs.Device {
	t.Helper()
	w, err := wire.NewFabric(wire.Faults{}).Attach(verbs.GIDFromAddr(netip.MustParseAddr("10.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	dev, err := soft.Open(soft.Config{Name: name, Wire: w})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dev.Close() })
	return dev
}

// The engine sizes its CQs to what the device holds, and refuses, naming
// the setting, a configuration whose queues the device cannot hold.
func TestConfigFitsDevice(t *testing.T) {
	dev := softDevice(t, "limited")
	for _, c := range []struct {
		name string
		dev  limited
		want string // "" if accepted
	}{
		{"rxe-sized CQs", limited{dev, 32767, 1 << 15, 1 << 15}, ""},
		{"CQ too small for the receive buffers", limited{dev, 4096, 1 << 15, 1 << 15}, "CQ entries for sends"},
		{"SRQ too small", limited{dev, 1 << 16, 1 << 15, 1000}, "SRQs hold 1000"},
		{"SQ too small", limited{dev, 1 << 16, 100, 1 << 15}, "QPs hold 100"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := Config{Device: c.dev}.withDefaults()
			if c.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if cfg.cqDepth != c.dev.maxCQE || cfg.sendBudget() != c.dev.maxCQE-cfg.RecvBuffers-cfg.DgramBuffers-pollBatch {
					t.Fatalf("CQ depth %d, send budget %d", cfg.cqDepth, cfg.sendBudget())
				}
				e, err := New(Config{Device: c.dev})
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				if err := e.Close(); err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("withDefaults: %v, want an error with %q", err, c.want)
			}
		})
	}
}

// An engine configured with zeros runs as a default agent does: the same
// transport policy and largest message (internal/transport's defaults).
func TestConfigDefaultsAreTheAgents(t *testing.T) {
	cfg, err := Config{Device: softDevice(t, "defaults")}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	agent := config.Default()
	if cfg.Transport.String() != string(agent.Transport) || int64(cfg.MaxMessage) != agent.MaxMessageBytes || cfg.QPsPerPeer != agent.QPsPerPeer {
		t.Errorf("engine defaults: transport %v, max message %d, QPs per peer %d; the agent's: %s, %d, %d",
			cfg.Transport, cfg.MaxMessage, cfg.QPsPerPeer, agent.Transport, agent.MaxMessageBytes, agent.QPsPerPeer)
	}
}
