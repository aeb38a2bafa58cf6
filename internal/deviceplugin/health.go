package deviceplugin

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
)

// health is the devices' health, shared by every ListAndWatch stream.
type health struct {
	mu      sync.Mutex
	healthy bool          // guarded by mu
	known   bool          // a probe has run; guarded by mu
	changed chan struct{} // closed and replaced on every change; guarded by mu
}

func newHealth() *health { return &health{changed: make(chan struct{})} }

// get returns the health and a channel closed at the next change.
func (h *health) get() (bool, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.healthy, h.changed
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

// probe asks the agent whether it and its device are up; the device it
// names places the advertised devices on their NUMA node.
func (p *Plugin) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	st, err := p.opts.Agent.Status(ctx)
	if err != nil {
		return err
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
		return errors.New("agent not ready")
	}
	return nil
}

// updateHealth probes the agent and records the result; when the
// devices become healthy again it asks for a garbage collection pass,
// which also re-creates the allocations a restarted agent lost.
func (p *Plugin) updateHealth(ctx context.Context) {
	err := p.probe(ctx)
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		p.metrics.healthy.Set(float64(p.n))
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
	p.log.Info("Devices are healthy: the agent is ready")
	select {
	case p.kick <- struct{}{}:
	default:
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
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			watchDir()
		case ev := <-events:
			if ev.Name != p.opts.Config.AdminSocket || !ev.Has(fsnotify.Create) {
				continue
			}
			p.log.Info("The agent's admin socket was created: the agent (re)started")
			select {
			case p.kick <- struct{}{}:
			default:
			}
		case err := <-errs:
			p.log.Error(err, "Watching the agent's admin socket")
			continue
		}
		p.updateHealth(ctx)
	}
}
