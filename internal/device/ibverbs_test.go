//go:build ibverbs && linux

package device

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

func ibvConfig(d config.DeviceConfig) *config.AgentConfig {
	cfg := config.Default()
	d.Provider = config.ProviderIBVerbs
	cfg.Device = d
	return cfg
}

// Bad input to the ibverbs provider fails with the reason the RDMANode
// shows and an error that says what is wrong: a device name that is not
// there, a GID index out of range, a port that is down. On a host without
// RDMA only the first is tried; hack/rxe-vm/engine.sh runs the rest on
// rxe0 (RDMAVISOR_RXE_VM=1).
func TestOpenBadInput(t *testing.T) {
	type tc struct {
		name   string
		cfg    config.DeviceConfig
		reason string
		says   string
	}
	cases := []tc{{"no such device", config.DeviceConfig{Names: []string{"mlx5_9"}}, ReasonNotFound, `no RDMA device matches names ["mlx5_9"]`}}
	if os.Getenv("RDMAVISOR_RXE_VM") == "1" {
		run := func(args ...string) {
			if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
				t.Fatalf("%v: %v: %s", args, err, out)
			}
		}
		// rxe on a dummy netdev left down: its port is DOWN.
		run("ip", "link", "add", "rvdev0", "type", "dummy")
		t.Cleanup(func() { _ = exec.Command("ip", "link", "del", "rvdev0").Run() })
		run("rdma", "link", "add", "rxedev", "type", "rxe", "netdev", "rvdev0")
		t.Cleanup(func() { _ = exec.Command("rdma", "link", "del", "rxedev").Run() })
		big, neg := 9999, -1
		cases = append(cases,
			tc{"GID index out of range", config.DeviceConfig{Names: []string{"rxe0"}, GIDIndex: &big}, ReasonInvalidGID, "GID index 9999 out of range"},
			tc{"negative GID index", config.DeviceConfig{Names: []string{"rxe0"}, GIDIndex: &neg}, ReasonInvalidGID, "GID index -1"},
			tc{"port down", config.DeviceConfig{Names: []string{"rxedev"}}, ReasonPortDown, "not ACTIVE"},
			tc{"no such port", config.DeviceConfig{Names: []string{"rxe0"}, Port: 2}, ReasonInvalidPort, "not port 2"},
		)
	}
	for _, c := range cases {
		dev, err := Open(ibvConfig(c.cfg))
		if err == nil {
			_ = dev.Close()
			t.Errorf("%s: opened", c.name)
			continue
		}
		if Reason(err) != c.reason || !strings.Contains(err.Error(), c.says) {
			t.Errorf("%s: %s: %v; want %s saying %q", c.name, Reason(err), err, c.reason, c.says)
		}
		t.Logf("%s: %s: %v", c.name, Reason(err), err)
	}
	if os.Getenv("RDMAVISOR_RXE_VM") == "1" {
		dev, err := Open(ibvConfig(config.DeviceConfig{Names: []string{"rxe0"}}))
		if err != nil {
			t.Fatalf("rxe0: %v", err)
		}
		_ = dev.Close()
	}
}
