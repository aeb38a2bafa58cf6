package engine

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// slowRelease is registered memory whose deregistration takes a while,
// as a region's or a staging's can under load.
type slowRelease struct {
	started chan struct{}
	done    atomic.Bool
}

func (s *slowRelease) release() error {
	close(s.started)
	time.Sleep(300 * time.Millisecond)
	s.done.Store(true)
	return nil
}

func (s *slowRelease) on() *Peer { return nil }

// TestCloseWaitsForGraceRelease: memory whose grace ran out just before
// the engine closed is deregistered by its timer, outside graceMu; Close
// must wait for that, or it deallocates the PD with the memory still
// registered ("dealloc pd: 1 objects still use it", seen when
// pkg/vconn's TestStagedCancel closed its cluster about regionGrace after
// abandoning a staged read).
func TestCloseWaitsForGraceRelease(t *testing.T) {
	e, _ := testEngines(t, wire.Faults{}, Config{})
	r := &slowRelease{started: make(chan struct{})}
	e.releaseLater(r)
	<-r.started // the grace ran out: its timer deregisters r
	_ = e.Close()
	if !r.done.Load() {
		t.Fatal("Close returned while memory whose grace ran out was still being deregistered")
	}
}
