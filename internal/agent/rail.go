package agent

import (
	"fmt"
	"strings"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// DefaultRailCheckInterval is how often the agent queries its rails'
// ports by default (Options.RailCheckInterval): a query is a system call
// or two, and a rail found down a few seconds late only means the
// allocations made meanwhile are bound to it, as to a rail that goes down
// after they were made.
const DefaultRailCheckInterval = 2 * time.Second

// watchRails queries every rail's port each RailCheckInterval until the
// agent closes (checkRails).
func (a *Agent) watchRails() {
	t := time.NewTicker(a.opts.RailCheckInterval)
	defer t.Stop()
	for {
		select {
		case <-a.ctx.Done():
			return
		case <-t.C:
			a.checkRails()
		}
	}
}

// railDownReason says why dev cannot carry vconns, or "" while its port is
// ACTIVE: the port's state, or the query's error for a device that
// disappeared (hot-unplugged: EIO, ENODEV).
func railDownReason(dev verbs.Device) string {
	st, err := dev.PortState()
	switch {
	case err != nil:
		return fmt.Sprintf("port query failed: %v", err)
	case !st.Active():
		return "port " + st.String()
	}
	return ""
}

// checkRails queries each rail's port and records why it is down (Status
// reports it as admin.Rail.Down), logging each change. A rail that is
// down takes no new allocation (pickRail); the vconns already on it are
// left to fail as the hardware fails them (their QPs' work requests
// complete in error, or the peer's heartbeats stop), which the engine
// handles as for any lost path: tearing them down here would only fail
// them sooner on a link that may come back. A rail that comes back ACTIVE
// takes allocations again. The agent stays ready while a rail is down:
// the other rails still serve.
func (a *Agent) checkRails() {
	for i, dev := range a.devs {
		why := railDownReason(dev)
		a.mu.Lock()
		was := a.railDown[i]
		a.railDown[i] = why
		a.mu.Unlock()
		if why == was {
			continue
		}
		log := a.log.WithValues("rail", i, "device", dev.Attr().Name)
		if why == "" {
			log.Info("Rail is up again: new allocations may be bound to it", "wasDown", was)
		} else {
			log.Info("Rail is down: no new allocation is bound to it, its vconns fail as the device fails them", "reason", why)
		}
	}
}

// pickRail returns the rail an allocation asking for rail is bound to.
// Rail 0, the admin protocol's default, asks for the first rail that is
// up: rail 0 while it is. Any other is the creator's choice, refused
// while the rail is down. The caller holds a.mu and checked that rail
// exists.
func (a *Agent) pickRail(rail int) (int, error) {
	if rail != 0 {
		if why := a.railDown[rail]; why != "" {
			return 0, fmt.Errorf("rail %d (%s) is down: %s: %w", rail, a.devs[rail].Attr().Name, why, admin.ErrUnavailable)
		}
		return rail, nil
	}
	var downs []string
	for i, why := range a.railDown {
		if why == "" {
			return i, nil
		}
		downs = append(downs, fmt.Sprintf("rail %d (%s): %s", i, a.devs[i].Attr().Name, why))
	}
	return 0, fmt.Errorf("every rail of node %s is down (%s): %w", a.cfg.NodeName, strings.Join(downs, "; "), admin.ErrUnavailable)
}

// railsDown returns why each rail is down ("" for one that is up).
func (a *Agent) railsDown() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.railDown...)
}
