package wire

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// link watches the interface that holds a UDP wire's bind address, as rxe
// watches its netdev: the port is ACTIVE while an interface that is up
// and running (has carrier) holds the address, DOWN otherwise.
//
// Its netlink socket is opened with the UDP socket, so it lives in the
// same network namespace and keeps looking there whatever thread asks.
type link struct {
	addr netip.Addr
	loop bool // addr is a loopback address: lo's prefix (127/8, ::1) covers it

	mu sync.Mutex
	h  *netlink.Handle // nil once closed; guarded by mu
}

func newLink(addr netip.Addr) (*link, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("wire: netlink socket to watch %v: %w", addr, err)
	}
	return &link{addr: addr.WithZone(""), loop: addr.IsLoopback(), h: h}, nil
}

func (l *link) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h != nil {
		l.h.Close()
		l.h = nil
	}
}

// state is the port state the interfaces give: ACTIVE when one that is up
// and running holds the address.
func (l *link) state() (verbs.PortState, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.h == nil {
		return 0, errClosed
	}
	family := netlink.FAMILY_V6
	if l.addr.Is4() {
		family = netlink.FAMILY_V4
	}
	addrs, err := l.h.AddrList(nil, family)
	if err != nil {
		return 0, fmt.Errorf("wire: listing the addresses to find %v: %w", l.addr, err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		if ip.Unmap() != l.addr && !(l.loop && a.IPNet != nil && a.IPNet.Contains(l.addr.AsSlice())) {
			continue
		}
		ln, err := l.h.LinkByIndex(a.LinkIndex)
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			continue // gone since the address dump
		}
		if err != nil {
			return 0, fmt.Errorf("wire: the interface holding %v: %w", l.addr, err)
		}
		at := ln.Attrs()
		if l.loop && ip.Unmap() != l.addr && at.Flags&net.FlagLoopback == 0 {
			continue // a prefix covers addr only on the loopback interface
		}
		if at.Flags&net.FlagUp != 0 && at.RawFlags&unix.IFF_RUNNING != 0 {
			return verbs.PortStateActive, nil
		}
	}
	return verbs.PortStateDown, nil
}
