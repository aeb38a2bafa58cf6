package agent

import (
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine"
)

// failedTellDelay gathers the vconns of a pod that fail together (a lost
// node fails all of its vconns to it at once, a rail that went down those
// on it as their QPs fail) into one Event.
const failedTellDelay = time.Second

// failures counts an allocation's vconns that failed for the path (a
// peer node, its agent or a QP lost), to tell its pod in one Event.
type failures struct {
	mu      sync.Mutex
	n       int
	why     string // the first failure's error
	pending bool   // a tell is scheduled
}

// failed counts a vconn of al that ended with err, if the path failed it:
// the pod then gets a VConnsFailed Event (PodEvents) saying how many and
// why, once per failedTellDelay. A close, a reset by the peer
// application or a refusal is the application's business, not an Event.
func (al *allocation) failed(err error) {
	if al.a.opts.PodEvents == nil || !(errors.Is(err, engine.ErrPeerGone) || errors.Is(err, engine.ErrQPFailed)) {
		return
	}
	f := &al.failures
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.why == "" {
		f.why = err.Error()
	}
	if !f.pending {
		f.pending = true
		time.AfterFunc(failedTellDelay, al.tellFailed)
	}
}

func (al *allocation) tellFailed() {
	f := &al.failures
	f.mu.Lock()
	n, why := f.n, f.why
	f.n, f.why, f.pending = 0, "", false
	f.mu.Unlock()
	al.mu.Lock()
	pod := al.pod
	al.mu.Unlock()
	if pod == "" {
		return // not a pod's: nobody to tell
	}
	ns, name, _ := strings.Cut(pod, "/")
	p, ok := al.a.podRef(ns, name)
	if !ok {
		return // the CNI plugin never registered it: no UID to find its Events by
	}
	al.a.opts.PodEvents.VConnsFailed(p, n, why)
}
