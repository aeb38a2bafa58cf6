package agent_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/netnstest"
)

// TestRailDownOnLink: end to end with the soft provider, in a network
// namespace of the test's own: rail 1's device is bound to an address of
// a veth link; taking the link down makes the rail down ("port DOWN")
// and an allocation on it refused, bringing it up makes it allocatable,
// and removing the address makes it down again.
func TestRailDownOnLink(t *testing.T) {
	netnstest.Run(t, func() error { return railDownOnLink(t) })
}

func railDownOnLink(t *testing.T) (err error) {
	v, err := netnstest.NewVeth("rail1", "10.99.0.1/24")
	if err != nil {
		return err
	}
	veth, addr := v.Link, v.Addr
	ctl, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		return err
	}
	ml, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		return err
	}
	dir := t.TempDir()
	cfg := config.Default()
	cfg.NodeName = "node-n"
	cfg.Device.Provider = config.ProviderSoft
	cfg.Device.Rails = 2
	cfg.Soft.BindAddress = "127.0.0.2"
	cfg.Soft.RailAddresses = []string{"10.99.0.1"}
	cfg.Soft.UDPPort = 4791
	cfg.Pollers = 1
	cfg.SocketDir = dir
	cfg.AdminSocket = dir + "/admin.sock"
	cfg.PeerDiscovery.Mode = config.DiscoveryStatic
	a, err := agent.New(agent.Options{Config: cfg, OpenDevice: device.Open, OpenRails: device.OpenRails,
		ControlListener: ctl, MetricsListener: ml, RailCheckInterval: 10 * time.Millisecond})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := a.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ac, err := admin.Dial(ctx, cfg.AdminSocket)
	if err != nil {
		return err
	}
	defer ac.Close()
	// wait polls until rail 1's Down is want (rail 0 stays up).
	wait := func(step, want string) error {
		for {
			st := a.Status()
			if len(st.Rails) != 2 || st.Rails[0].Down != "" {
				return fmt.Errorf("%s: rails %+v; want two, rail 0 up", step, st.Rails)
			}
			if st.Rails[1].Down == want {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: rail 1 down %q, want %q", step, st.Rails[1].Down, want)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	create := func(step, id string, down bool) error {
		al, err := ac.Create(ctx, admin.Allocation{ID: id, VConns: 1, Rail: 1})
		switch {
		case down && (err == nil || !strings.Contains(err.Error(), "rail 1 (soft-10.99.0.1) is down: port DOWN")):
			return fmt.Errorf("%s: an allocation on rail 1: %v; want a refusal saying rail 1's port is DOWN", step, err)
		case !down && (err != nil || al.Rail != 1):
			return fmt.Errorf("%s: an allocation on rail 1: rail %d, %v", step, al.Rail, err)
		}
		return nil
	}
	for _, s := range []struct {
		name   string
		change func() error
		down   string
	}{
		{"up", func() error { return nil }, ""},
		{"link down", func() error { return netlink.LinkSetDown(veth) }, "port DOWN"},
		{"link up", func() error { return netlink.LinkSetUp(veth) }, ""},
		{"address removed", func() error { return netlink.AddrDel(veth, addr) }, "port DOWN"},
	} {
		if err := s.change(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if err := wait(s.name, s.down); err != nil {
			return err
		}
		if err := create(s.name, "a-"+strings.ReplaceAll(s.name, " ", "-"), s.down != ""); err != nil {
			return err
		}
	}
	return nil
}
