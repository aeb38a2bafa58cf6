package agent

import (
	"sync/atomic"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// tenantStats are an allocation's counters of its pod's traffic and
// refusals, for the per-pod metrics (collectTenants). They live and die
// with the allocation, so a pod's series go with it and need no
// deleting. The send loop (forward) and the delivery loop (deliver) add
// to them once per message, plain atomic adds; the collector reads them
// when scraped.
type tenantStats struct {
	// Each loop's counters on lines of their own: a vconn's sending and
	// delivering goroutines add at once, and other vconns' with them.
	_                                 [64]byte
	sentMsgs, sentBytes, sendsDropped atomic.Uint64
	_                                 [64]byte
	recvMsgs, recvBytes, recvsDropped atomic.Uint64
	_                                 [64]byte
	refusals                          [numRefusals]atomic.Uint64
}

// sent counts a message of n bytes that forward handed to the engine,
// or, if the engine failed it (err), one dropped.
func (t *tenantStats) sent(n int, err error) {
	if err != nil {
		t.sendsDropped.Add(1)
		return
	}
	t.sentMsgs.Add(1)
	t.sentBytes.Add(uint64(n))
}

// received counts a message of n bytes that deliver handed to the pod,
// or, if the carrier could not take it (!ok), one dropped.
func (t *tenantStats) received(n int, ok bool) {
	if !ok {
		t.recvsDropped.Add(1)
		return
	}
	t.recvMsgs.Add(1)
	t.recvBytes.Add(uint64(n))
}

// dropReceived counts a message deliver took from the engine and did not
// hand to the pod (too large for its carrier, or the vconn ended).
func (t *tenantStats) dropReceived() { t.recvsDropped.Add(1) }

// refusal is why a request of the pod was refused, a label of
// rdmavisor_pod_refusals_total: a small fixed set, of the codes that say
// the pod is at a bound of its own or dialed nothing.
type refusal uint8

const (
	refusedQuota     refusal = iota // frame.CodeQuota: its allocation's vconns, or the dialed one's, all in use
	refusedLimit                    // frame.CodeLimit: a limit of its allocation (sessions, listeners, regions)
	refusedDial                     // frame.CodeRefused: nothing listens at the address dialed, or a NetworkPolicy refuses it
	refusedAddrInUse                // frame.CodeAddrInUse: the port listened on has a listener
	numRefusals
)

var refusalNames = [numRefusals]string{"quota", "limit", "refused", "address_in_use"}

func (r refusal) String() string { return refusalNames[r] }

// refusalOf is the refusal an error reply of code c counts as; false for
// the codes that are none (a bad request, a vconn's failure).
func refusalOf(c frame.Code) (refusal, bool) {
	switch c {
	case frame.CodeQuota:
		return refusedQuota, true
	case frame.CodeLimit:
		return refusedLimit, true
	case frame.CodeRefused:
		return refusedDial, true
	case frame.CodeAddrInUse:
		return refusedAddrInUse, true
	}
	return 0, false
}

// refused counts a refusal.
func (t *tenantStats) refused(r refusal) { t.refusals[r].Add(1) }

// The allocation whose counters each source's messages count in.

func (s *opSource) tenant() *tenantStats { return &s.h.s.al.stats }
func (t shmTX) tenant() *tenantStats     { return &t.x.h.s.al.stats }
func (t *bridgeTX) tenant() *tenantStats { return &t.b.al.stats }
