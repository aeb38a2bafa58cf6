package soft

import (
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rdmavisor/rdmavisor/internal/netnstest"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// TestPortStateFollowsLink: a UDP device's port follows the interface that
// holds its bind address, as rxe's follows its netdev: ACTIVE while the
// link is up, DOWN while it is down, ACTIVE again once it is back, and
// DOWN once the address is gone. A device on loopback (lo's 127/8) is
// ACTIVE; a closed one fails with ErrClosed. The
// link changes in a network namespace of the test's own, on a veth
// pair.
func TestPortStateFollowsLink(t *testing.T) {
	netnstest.Run(t, func() error { return portStateInNetns(t) })
}

func portStateInNetns(t *testing.T) error {
	v, err := netnstest.NewVeth("rail0", "10.99.0.1/24")
	if err != nil {
		return err
	}
	veth, peer, addr := v.Link, v.Peer, v.Addr
	open := func(bind string) (*Device, error) {
		d, err := OpenUDP(bind, 4791)
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { _ = d.Close() })
		return d, nil
	}
	dev, err := open("10.99.0.1")
	if err != nil {
		return err
	}
	loop, err := open("127.0.0.7")
	if err != nil {
		return err
	}
	want := func(step string, d *Device, s verbs.PortState) error {
		got, err := d.PortState()
		if err != nil || got != s {
			return fmt.Errorf("%s: %s's port %v, %v; want %v", step, d.Attr().Name, got, err, s)
		}
		return nil
	}
	steps := []struct {
		name   string
		change func() error
		want   verbs.PortState
	}{
		{"up", func() error { return nil }, verbs.PortStateActive},
		{"link down", func() error { return netlink.LinkSetDown(veth) }, verbs.PortStateDown},
		{"link up again", func() error { return netlink.LinkSetUp(veth) }, verbs.PortStateActive},
		{"carrier lost", func() error { return netlink.LinkSetDown(peer) }, verbs.PortStateDown},
		{"carrier back", func() error { return netlink.LinkSetUp(peer) }, verbs.PortStateActive},
		{"address removed", func() error { return netlink.AddrDel(veth, addr) }, verbs.PortStateDown},
		{"address back", func() error { return netlink.AddrAdd(veth, addr) }, verbs.PortStateActive},
	}
	for _, s := range steps {
		if err := s.change(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		if err := errors.Join(want(s.name, dev, s.want), want(s.name, loop, verbs.PortStateActive)); err != nil {
			return err
		}
	}
	// Another thread, in the test's own namespace, asks: the device
	// still looks where its socket is.
	res := make(chan error)
	go func() { res <- want("asked from another namespace", dev, verbs.PortStateActive) }()
	if err := <-res; err != nil {
		return err
	}
	if err := dev.Close(); err != nil {
		return err
	}
	if _, err := dev.PortState(); !errors.Is(err, verbs.ErrClosed) {
		return fmt.Errorf("a closed device's port state: %v; want ErrClosed", err)
	}
	if _, err := net.InterfaceByName("rail0"); err != nil {
		return fmt.Errorf("the namespace lost its link: %w", err)
	}
	return nil
}
