package soft

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

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
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (a network namespace and a veth link); CI runs it as root")
	}
	errc := make(chan error)
	go func() {
		// The thread enters the namespace and is never unlocked: it exits
		// with the goroutine, so no other goroutine runs in it.
		runtime.LockOSThread()
		errc <- portStateInNetns(t)
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func portStateInNetns(t *testing.T) error {
	if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("unshare: %w", err)
	}
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return err
	}
	// A veth pair (the kernel here may lack the dummy driver): rail0
	// has carrier while its peer is up too.
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "rail0"}, PeerName: "rail0p"}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("adding a veth pair: %w", err)
	}
	peer, err := netlink.LinkByName("rail0p")
	if err != nil {
		return err
	}
	if err := netlink.LinkSetUp(peer); err != nil {
		return err
	}
	addr, err := netlink.ParseAddr("10.99.0.1/24")
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(veth, addr); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(veth); err != nil {
		return err
	}
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
