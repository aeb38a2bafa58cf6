package agent

import (
	"fmt"
	"net/netip"
)

// acceptShare: one caller (a node and the pod IP it dials from, as that
// node's agent says) may hold at most 1/acceptShare of a listening
// allocation's vconn quota (at least 1) in the vconns its dials to the
// allocation's listeners were given. Without it one tenant that dials and
// holds its vconns takes the whole quota, and every other tenant's dials
// are refused; with half, the others keep the other half, whatever the
// first does. Counted over the allocation's listeners, since the quota is
// the allocation's: two listeners would otherwise give one caller all of
// it. (spec.limits is to make it configurable.)
const acceptShare = 2

// acceptCap is the most vconns one caller may hold of al's accepted ones.
func (al *allocation) acceptCap() int { return max(1, al.quota/acceptShare) }

// acceptCaller names the caller of a Dial for its share: the calling
// node and, when it says, the pod IP it dials from (else the node's host
// services, which dial from none).
func acceptCaller(node string, fromIP []byte) string {
	if ip, ok := netip.AddrFromSlice(fromIP); ok {
		return "pod " + ip.Unmap().String() + " of node " + node
	}
	return "node " + node + "'s host services"
}

// takeAccept claims a vconn of the quota for a dial of caller that one of
// al's listeners accepts, within the caller's share. giveFor(caller)
// returns it.
func (al *allocation) takeAccept(caller string) error {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed || al.used >= al.quota {
		return fmt.Errorf("allocation %s has all its %d vconns in use", al.id, al.quota)
	}
	if n := al.accepted[caller]; n >= al.acceptCap() {
		return fmt.Errorf("caller %s holds %d vconns of allocation %s, the most one caller may (1/%d of its quota of %d)",
			caller, n, al.id, acceptShare, al.quota)
	}
	if al.accepted == nil {
		al.accepted = make(map[string]int)
	}
	al.used++
	al.accepted[caller]++
	return nil
}

// giveFor returns a vconn to the quota and, for one accepted from caller
// (not ""), to the caller's share.
func (al *allocation) giveFor(caller string) {
	al.mu.Lock()
	defer al.mu.Unlock()
	al.used--
	if caller == "" {
		return
	}
	if al.accepted[caller]--; al.accepted[caller] <= 0 {
		delete(al.accepted, caller) // a caller gone holds no entry
	}
}
