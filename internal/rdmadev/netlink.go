package rdmadev

import (
	"errors"
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// NetlinkNames lists the RDMA devices the kernel's RDMA netlink family
// reports to this network namespace (`rdma dev show`), sorted; root is
// unused (it matches List's names argument). A kernel without RDMA
// support has none: not an error.
func NetlinkNames(string) ([]string, error) {
	links, err := netlink.RdmaLinkList()
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		if isNoRDMA(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("rdmadev: listing RDMA links by netlink: %w", err)
	}
	if err != nil {
		// The dump changed under us (a device came or went): once more.
		if links, err = netlink.RdmaLinkList(); err != nil {
			return nil, fmt.Errorf("rdmadev: listing RDMA links by netlink: %w", err)
		}
	}
	names := make([]string, 0, len(links))
	for _, l := range links {
		names = append(names, l.Attrs.Name)
	}
	slices.Sort(names)
	return names, nil
}

// isNoRDMA reports whether a netlink error means the kernel has no RDMA
// netlink family (no ib_core): no devices.
func isNoRDMA(err error) bool {
	return errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EOPNOTSUPP)
}
