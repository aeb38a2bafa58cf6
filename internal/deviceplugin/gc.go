package deviceplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// collect deletes the device plugin's allocations that no container
// holds any more, and re-creates those a container holds but the agent
// lost (it restarted); see the package documentation. It returns the ids
// deleted.
func (p *Plugin) collect(ctx context.Context) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	// Pods first: an allocation created after this listing is protected
	// by GCGrace, not missed.
	held, err := p.heldAllocations(ctx)
	if err != nil {
		return nil, err
	}
	als, err := p.opts.Agent.ListAllocations(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	g := gcRound{keep: make(map[string]int, len(als))}
	for _, al := range als {
		if strings.HasPrefix(al.ID, allocPrefix) {
			p.sweep(ctx, &al, held, &g)
		}
	}
	present := make(map[string]bool, len(als))
	for _, al := range als {
		present[al.ID] = true
	}
	for id, h := range held {
		if !present[id] {
			p.recreate(ctx, id, h, &g)
		}
	}
	p.sweepDirs(present, held, &g)
	// Forget creation times of allocations that are gone.
	p.mu.Lock()
	for id, t := range p.created {
		if !present[id] && now.Sub(t) >= p.opts.GCGrace {
			delete(p.created, id)
		}
	}
	p.mu.Unlock()
	p.metrics.allocated.Set(float64(g.allocated))
	if err := p.syncSpecs(g.keep); err != nil {
		g.errs = append(g.errs, err)
	}
	return g.deleted, errors.Join(g.errs...)
}

// heldAllocation is an allocation of a running pod, as the kubelet lists
// its devices.
type heldAllocation struct {
	vconns int
	pod    string
	rail   int // the rail Allocate bound it to
}

// gcRound is what one collection found and did.
type gcRound struct {
	keep      map[string]int // the allocations kept, with their vconns
	deleted   []string
	errs      []error
	allocated int // the vconns of the allocations kept
}

// heldAllocations are the allocations of the running pods, by id.
func (p *Plugin) heldAllocations(ctx context.Context) (map[string]heldAllocation, error) {
	held, err := p.opts.PodResources.Devices(ctx, p.opts.Config.ResourceName)
	if err != nil {
		return nil, err
	}
	live := make(map[string]heldAllocation, len(held))
	_, down, _ := p.health.get()
	for _, h := range held {
		if checkDevices(h.IDs, p.n) == nil {
			id := AllocationID(&p.key, h.IDs)
			live[id] = heldAllocation{vconns: len(h.IDs), pod: h.Pod, rail: p.topo.railOf(h.IDs, down)}
		}
	}
	return live, nil
}

// sweep keeps the agent's allocation al if a running pod holds it or it is
// recent, binding it to its pod, and deletes it otherwise.
func (p *Plugin) sweep(ctx context.Context, al *admin.Allocation, held map[string]heldAllocation, g *gcRound) {
	if h, ok := held[al.ID]; ok || p.recent(al.ID) {
		g.allocated += al.VConns
		g.keep[al.ID] = al.VConns
		// The agent lets a pod's allocation listen and dial only as
		// its pod, which it learns here.
		if pod := h.pod; pod != "" && pod != al.Pod {
			if err := p.opts.Agent.BindAllocation(ctx, al.ID, pod); err != nil {
				g.errs = append(g.errs, err)
			} else {
				p.log.Info("Bound an allocation to its pod", "allocation", al.ID, "pod", pod)
			}
		}
		return
	}
	if err := p.opts.Agent.DeleteAllocation(ctx, al.ID); err != nil && !errors.Is(err, admin.ErrNotFound) {
		g.errs = append(g.errs, err)
		g.allocated += al.VConns
		g.keep[al.ID] = al.VConns
		return
	}
	p.mu.Lock()
	delete(p.created, al.ID)
	p.mu.Unlock()
	g.deleted = append(g.deleted, al.ID)
	p.metrics.collected.Inc()
	p.log.Info("Deleted an allocation no pod holds", "allocation", al.ID, "vconns", al.VConns, "inUse", al.InUse)
}

// recreate makes again, for its pod, the allocation id of a running pod
// that the agent has lost.
func (p *Plugin) recreate(ctx context.Context, id string, h heldAllocation, g *gcRound) {
	k := h.vconns
	err := p.create(ctx, id, k, h.rail)
	if err == nil {
		err = p.opts.Agent.BindAllocation(ctx, id, h.pod)
	}
	switch {
	case err == nil:
		p.log.Info("Re-created the allocation of a running pod: the agent had lost it", "allocation", id, "vconns", k, "rail", h.rail)
		p.metrics.recreated.Inc()
		g.allocated += k
		g.keep[id] = k
	case errors.Is(err, admin.ErrExists): // Allocate made it since the listing
		g.keep[id] = k
	default:
		g.errs = append(g.errs, err)
	}
}

// recent reports whether this process made allocation id within GCGrace:
// the kubelet may not list its container yet.
func (p *Plugin) recent(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.created[id]
	return ok && time.Since(t) < p.opts.GCGrace
}

// refreshAllocated updates the allocated-devices gauge from the agent.
func (p *Plugin) refreshAllocated(ctx context.Context) {
	als, err := p.opts.Agent.ListAllocations(ctx)
	if err != nil {
		return
	}
	n := 0
	for _, al := range als {
		if strings.HasPrefix(al.ID, allocPrefix) {
			n += al.VConns
		}
	}
	p.metrics.allocated.Set(float64(n))
}

// collectLoop runs collect at start, every GCInterval and when kicked,
// until ctx ends. A failed pass is retried after RetryInterval when that
// is sooner.
func (p *Plugin) collectLoop(ctx context.Context) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
		}
		next := p.opts.GCInterval
		if _, err := p.collect(ctx); err != nil && ctx.Err() == nil {
			next = min(next, p.opts.RetryInterval)
			p.log.Error(err, "Cannot collect allocations of pods that are gone; will retry", "in", next)
		}
		t.Reset(next)
	}
}

// sweepDirs removes the directory of each device plugin allocation that
// neither the agent (present) nor a running container (held) has: an
// agent that restarts keeps its allocations' directories, for the pods
// that mounted them, and comes back with no allocations, so the directory
// of one whose pod went while it was down has no one left to remove it.
// One this process made within GCGrace is kept (its pod may not be listed
// yet).
func (p *Plugin) sweepDirs(present map[string]bool, held map[string]heldAllocation, g *gcRound) {
	dir := filepath.Join(p.opts.Config.SocketDir, "alloc")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			g.errs = append(g.errs, err)
		}
		return
	}
	for _, e := range entries {
		id := e.Name()
		if !e.IsDir() || !strings.HasPrefix(id, allocPrefix) || present[id] || p.recent(id) {
			continue
		}
		if _, ok := held[id]; ok {
			continue
		}
		if err := os.RemoveAll(filepath.Join(dir, id)); err != nil {
			g.errs = append(g.errs, err)
			continue
		}
		p.log.Info("Removed the directory of an allocation neither the agent nor a pod has", "allocation", id)
	}
}
