package agent_test

import (
	"net"
	"runtime"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
)

// TestPollers: the agent's engine runs the configured pollers, and one per
// CPU the runtime was given (GOMAXPROCS) when the configuration leaves
// them zero.
func TestPollers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	for _, tc := range []struct{ set, want int }{{0, 3}, {1, 1}, {5, 5}} {
		dir := t.TempDir()
		cfg := config.Default()
		cfg.NodeName = "node-a"
		cfg.Device.Provider = config.ProviderSoft
		cfg.Soft.BindAddress = "127.0.0.2"
		cfg.Soft.UDPPort = freeUDPPort(t)
		cfg.BufferPoolBytes = 8 << 20
		cfg.SocketDir = dir
		cfg.AdminSocket = dir + "/admin.sock"
		cfg.MetricsAddress = "127.0.0.2:1" // unused: the listeners below serve
		cfg.PeerDiscovery = config.PeerDiscovery{Mode: config.DiscoveryStatic}
		cfg.Pollers = tc.set
		ctl, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		ml, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(agent.Options{Config: cfg, OpenDevice: device.Open, ControlListener: ctl, MetricsListener: ml})
		if err != nil {
			t.Fatalf("pollers %d: %v", tc.set, err)
		}
		got := a.Engine().Config().Pollers
		if err := a.Close(); err != nil {
			t.Error(err)
		}
		if got != tc.want {
			t.Errorf("pollers: %d in the config, GOMAXPROCS 3: the engine runs %d, want %d", tc.set, got, tc.want)
		}
	}
}

// freeUDPPort is a UDP port free on 127.0.0.2 a moment ago.
func freeUDPPort(t *testing.T) int {
	c, err := net.ListenPacket("udp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}
