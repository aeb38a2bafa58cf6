package device

import (
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// OpenRails opens one device by default, one per rail address of the soft
// provider with more rails, and refuses a rail count its configuration
// does not back, saying why.
func TestOpenRails(t *testing.T) {
	cfg := config.Default()
	cfg.Device.Provider = config.ProviderSoft
	cfg.Soft.BindAddress = "127.0.0.1"
	cfg.Soft.UDPPort = 0
	devs, err := OpenRails(cfg)
	if err != nil || len(devs) != 1 {
		t.Fatalf("default: %d devices, %v; want one", len(devs), err)
	}
	_ = devs[0].Close()

	two := *cfg
	two.Device.Rails = 2
	two.Soft.RailAddresses = []string{"127.0.0.4"}
	devs, err = OpenRails(&two)
	if err != nil || len(devs) != 2 {
		t.Fatalf("two rails: %d devices, %v", len(devs), err)
	}
	g0, _ := devs[0].GID(0)
	g1, _ := devs[1].GID(0)
	if g0.String() != "127.0.0.1" || g1.String() != "127.0.0.4" {
		t.Errorf("rail GIDs %v, %v; want 127.0.0.1, 127.0.0.4", g0, g1)
	}
	for _, d := range devs {
		_ = d.Close()
	}

	short := two
	short.Soft.RailAddresses = nil
	many := two
	many.Device.Rails = MaxRails + 1
	ib := two
	ib.Device.Provider = config.ProviderIBVerbs
	ib.Device.Names = []string{"mlx5_0"}
	badAddr := two
	badAddr.Soft.RailAddresses = []string{"not-an-ip"}
	for name, c := range map[string]struct {
		cfg  config.AgentConfig
		want string
	}{
		"soft without rail addresses": {short, "need 1 soft.railAddresses"},
		"too many rails":              {many, "at most 16"},
		"ibverbs with one name":       {ib, "need 2 device names"},
		"a bad rail address":          {badAddr, "rail 1"},
	} {
		devs, err := OpenRails(&c.cfg)
		if err == nil || !strings.Contains(err.Error(), c.want) || devs != nil {
			t.Errorf("%s: %d devices, %v; want an error with %q", name, len(devs), err, c.want)
		}
	}
}
