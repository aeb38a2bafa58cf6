package agent

import (
	"fmt"
	"net/netip"
	"strings"
)

// acceptKept and acceptKeptMax: of a listening allocation's vconn quota,
// 1/acceptKept (a quarter, rounded down), and at most acceptKeptMax
// vconns, is kept from any one caller of a listener (a node and the pod
// IP it dials from, as that node's agent says): one caller may hold at
// most the rest in the vconns its dials to the listener were given.
// Without it one tenant that dials and holds its vconns takes the whole
// quota, and every other tenant's dials are refused; with it the others
// always find some. A quarter, not half: a service's one client may still
// use most of its quota (3 of 4, as the protocol's examples do; both of a
// quota of 2, which keeps none). At most acceptKeptMax: 16 vconns are
// enough for another tenant to get in, and a quarter of a large quota
// kept from a service's one client is much. Pods only (isPodCaller).
// (spec.limits is to make it configurable.)
const (
	acceptKept    = 4
	acceptKeptMax = 16
)

// acceptCap is the most vconns one caller may hold of those a listener of
// al accepted.
func (al *allocation) acceptCap() int { return al.quota - al.kept() }

// kept is what acceptCap keeps from one caller.
func (al *allocation) kept() int { return min(al.quota/acceptKept, acceptKeptMax) }

// acceptCaller names the caller of a Dial for its share: the calling
// node and, when it says, the pod IP it dials from (else the node's host
// services, which dial from none).
func acceptCaller(node string, fromIP []byte) string {
	if ip, ok := netip.AddrFromSlice(fromIP); ok {
		return "pod " + ip.Unmap().String() + " of node " + node
	}
	return "node " + node + "'s host services"
}

// isPodCaller: the share is kept between pods, the tenants. A node's host
// services are the node's own programs on allocations root made (the
// demo's, a benchmark's): a service's one such client may use all of its
// quota, as the demo's and the idle test's 1,000 dials do.
func isPodCaller(caller string) bool { return strings.HasPrefix(caller, "pod ") }

// acceptSlot is a vconn's place in its allocation's quota: for one a
// listener accepted, the listener and the caller whose share it counts
// in; the zero slot is a dialled vconn's.
type acceptSlot struct {
	l      *listener
	caller string
}

// takeAccept claims a vconn of the quota for a dial of caller that
// listener l of al accepts, within the caller's share. giveFor(slot)
// returns it.
func (al *allocation) takeAccept(l *listener, caller string) (acceptSlot, error) {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed || al.used >= al.quota {
		return acceptSlot{}, fmt.Errorf("allocation %s has all its %d vconns in use", al.id, al.quota)
	}
	if n := l.accepted[caller]; isPodCaller(caller) && n >= al.acceptCap() {
		return acceptSlot{}, fmt.Errorf("caller %s holds %d vconns of allocation %s, the most one caller may: %d of its quota of %d are kept for others",
			caller, n, al.id, al.kept(), al.quota)
	}
	if l.accepted == nil {
		l.accepted = make(map[string]int)
	}
	al.used++
	l.accepted[caller]++
	return acceptSlot{l: l, caller: caller}, nil
}

// giveFor returns a vconn to the quota and, for one a listener accepted,
// to its caller's share.
func (al *allocation) giveFor(slot acceptSlot) {
	al.mu.Lock()
	defer al.mu.Unlock()
	al.used--
	if slot.l == nil {
		return
	}
	if slot.l.accepted[slot.caller]--; slot.l.accepted[slot.caller] <= 0 {
		delete(slot.l.accepted, slot.caller) // a caller gone holds no entry
	}
}
