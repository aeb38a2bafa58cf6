package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// health is the devices' health, shared by every ListAndWatch stream: the
// agent's, and that of each of its rails.
type health struct {
	mu      sync.Mutex
	healthy bool // guarded by mu
	known   bool // a probe has run; guarded by mu
	// down is why each of the agent's rails is down ("" while it is up),
	// as the agent last answered; nil while no rail is down. The caller
	// must not modify it. Guarded by mu.
	down    []string
	changed chan struct{} // closed and replaced on every change; guarded by mu
}

func newHealth() *health { return &health{changed: make(chan struct{})} }

// get returns the health, the rails' down reasons (see health.down) and
// a channel closed at the next change.
func (h *health) get() (bool, []string, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy, h.down, h.changed
}

// setDown records why each rail is down (nil: none is); it returns the
// rails' reasons before, and wakes the streams when they changed.
func (h *health) setDown(down []string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.down
	if slices.Equal(old, down) {
		return old
	}
	h.down = down
	close(h.changed)
	h.changed = make(chan struct{})
	return old
}

// railDown is down's reason for rail r, "" when it is up or unknown.
func railDown(down []string, r int) string {
	if r < len(down) {
		return down[r]
	}
	return ""
}

// downOf is why each rail is down, nil when none is.
func downOf(rails []admin.Rail) []string {
	var down []string
	for i, r := range rails {
		if r.Down == "" {
			continue
		}
		if down == nil {
			down = make([]string, len(rails))
		}
		down[i] = r.Down
	}
	return down
}

// railDevices is rail r's block of the n devices, of rails rails, as
// "vconn-0004..vconn-0007", for logs and errors.
func railDevices(r, rails, n int) string {
	lo, hi := -1, -1
	for i := range n {
		if i*rails/n == r {
			if lo < 0 {
				lo = i
			}
			hi = i
		}
	}
	if lo < 0 {
		return "none"
	}
	if lo == hi {
		return DeviceID(lo)
	}
	return fmt.Sprintf("%s..%s", DeviceID(lo), DeviceID(hi))
}

// touch wakes the ListAndWatch streams without a change of health (the
// devices' topology changed).
func (h *health) touch() {
	h.mu.Lock()
	defer h.mu.Unlock()
	close(h.changed)
	h.changed = make(chan struct{})
}

// set records a probe's result; it reports whether the health changed.
func (h *health) set(ok bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.known && h.healthy == ok {
		return false
	}
	h.known, h.healthy = true, ok
	close(h.changed)
	h.changed = make(chan struct{})
	return true
}

// probe asks the agent whether it and its device are up, and returns its
// rails; the devices it names place the advertised devices on their NUMA
// node.
func (p *Plugin) probe(ctx context.Context) ([]admin.Rail, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	st, err := p.opts.Agent.Status(ctx)
	if err != nil {
		return nil, err
	}
	devices := []string{st.Device}
	if len(st.Rails) > 0 {
		devices = devices[:0]
		for _, r := range st.Rails {
			devices = append(devices, r.Device)
		}
	}
	if p.topo.learn(devices) {
		p.log.Info("The devices' NUMA node follows the agent's RDMA devices", "devices", devices)
		p.health.touch()
	}
	if !st.Ready {
		return st.Rails, errors.New("agent not ready")
	}
	return st.Rails, nil
}

// updateHealth probes the agent and records the result; when the
// devices become healthy again it asks for a garbage collection pass,
// which also re-creates the allocations a restarted agent lost. The
// devices of a rail the agent says is down are unhealthy while it is.
func (p *Plugin) updateHealth(ctx context.Context) {
	rails, err := p.probe(ctx)
	if ctx.Err() != nil {
		return
	}
	// An agent that does not answer says nothing of its rails: what they
	// were is kept (its devices are all unhealthy meanwhile anyway).
	if rails != nil || err == nil {
		down := downOf(rails)
		p.railsChanged(rails, p.health.setDown(down), down)
	}
	_, down, _ := p.health.get()
	if err == nil {
		p.metrics.healthy.Set(float64(p.n - p.downDevices(down)))
	} else {
		p.metrics.healthy.Set(0)
	}
	if !p.health.set(err == nil) {
		return
	}
	if err != nil {
		p.log.Info("Devices are unhealthy", "reason", err.Error())
		return
	}
	p.log.Info("Devices are healthy: the agent is ready", "unhealthyOfDownRails", p.downDevices(down))
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// downDevices counts the devices of the rails down says are down.
func (p *Plugin) downDevices(down []string) int {
	k := 0
	for i := range p.n {
		if railDown(down, i*len(down)/p.n) != "" {
			k++
		}
	}
	return k
}

// railsChanged logs each rail that went down or came back up between old
// and down, the reasons before and now; a rail back up asks for a garbage
// collection pass (the allocations of its pods may need re-creating).
func (p *Plugin) railsChanged(rails []admin.Rail, old, down []string) {
	up := false
	for i, r := range rails {
		was, is := railDown(old, i), railDown(down, i)
		switch {
		case is != "" && is != was:
			p.log.Info("A rail is down: its devices are unhealthy", "rail", i, "device", r.Device, "reason", is,
				"devices", railDevices(i, len(rails), p.n))
		case is == "" && was != "":
			p.log.Info("A rail is up again: its devices are healthy", "rail", i, "device", r.Device, "was", was,
				"devices", railDevices(i, len(rails), p.n))
			up = true
		}
	}
	if up {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// watchHealth probes the agent every HealthInterval, and at once when
// the admin socket is created again (the agent restarted, however fast),
// until ctx ends. A restart also asks for a garbage collection pass, which
// re-creates the allocations the agent lost.
func (p *Plugin) watchHealth(ctx context.Context) {
	t := time.NewTicker(p.opts.HealthInterval)
	defer t.Stop()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		p.log.Error(err, "Cannot watch the agent's admin socket; polling only")
	} else {
		defer w.Close()
	}
	var events <-chan fsnotify.Event
	var errs <-chan error
	// watchDir starts watching the admin socket's directory, which may
	// not exist before the agent first starts.
	watchDir := func() {
		if w == nil || events != nil {
			return
		}
		if err := w.Add(filepath.Dir(p.opts.Config.AdminSocket)); err == nil {
			events, errs = w.Events, w.Errors
		}
	}
	watchDir()
	// soon probes again shortly while an agent that has just (re)started
	// is not ready yet: its pods' allocations are re-created once it is,
	// and until then their sockets are missing, though the agent's own
	// probe may already say ready.
	var soon <-chan time.Time
	var started time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			watchDir()
		case <-soon:
			soon = nil
		case ev := <-events:
			if ev.Name != p.opts.Config.AdminSocket || !ev.Has(fsnotify.Create) {
				continue
			}
			p.log.Info("The agent's admin socket was created: the agent (re)started")
			started = time.Now()
			select {
			case p.kick <- struct{}{}:
			default:
			}
		case err := <-errs:
			p.log.Error(err, "Watching the agent's admin socket")
			continue
		}
		p.updateHealth(ctx)
		if healthy, _, _ := p.health.get(); !healthy && soon == nil && time.Since(started) < startingFor {
			soon = time.After(startingProbe)
		}
	}
}

// While an agent started less than startingFor ago is not ready, it is
// probed every startingProbe rather than every HealthInterval.
const (
	startingFor   = time.Minute
	startingProbe = 100 * time.Millisecond
)
