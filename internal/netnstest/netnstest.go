// Package netnstest runs a test's code in a network namespace of its own,
// with links it can take down and bring back: what a NIC's link does to
// the port above it. It needs root, as CI has.
package netnstest

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Run calls fn on a thread of its own in a new network namespace whose
// loopback is up, and fails t with fn's error. The thread is never
// unlocked: it exits with its goroutine, so nothing else runs in the
// namespace.
func Run(t *testing.T, fn func() error) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test needs root (a network namespace and a veth link); CI runs it as root")
	}
	errc := make(chan error)
	go func() {
		runtime.LockOSThread()
		errc <- enter(fn)
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func enter(fn func() error) error {
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
	return fn()
}

// Veth is a veth pair, both ends up, with an address on Link: Link has
// carrier while Peer is up (a veth, since a kernel may lack the dummy
// driver).
type Veth struct {
	Link, Peer netlink.Link
	Addr       *netlink.Addr
}

// NewVeth adds the pair name and name+"p" in the current namespace, with
// cidr (e.g. 10.99.0.1/24) on name.
func NewVeth(name, cidr string) (*Veth, error) {
	link := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(link); err != nil {
		return nil, fmt.Errorf("adding a veth pair: %w", err)
	}
	peer, err := netlink.LinkByName(name + "p")
	if err != nil {
		return nil, err
	}
	addr, err := netlink.ParseAddr(cidr)
	if err != nil {
		return nil, err
	}
	for _, step := range []func() error{
		func() error { return netlink.AddrAdd(link, addr) },
		func() error { return netlink.LinkSetUp(peer) },
		func() error { return netlink.LinkSetUp(link) },
	} {
		if err := step(); err != nil {
			return nil, err
		}
	}
	return &Veth{Link: link, Peer: peer, Addr: addr}, nil
}
