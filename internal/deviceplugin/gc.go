package deviceplugin

import (
	"context"
	"errors"
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
	held, err := p.opts.PodResources.Devices(ctx, p.opts.Config.ResourceName)
	if err != nil {
		return nil, err
	}
	live := make(map[string]int, len(held)) // id -> vconns
	owner := make(map[string]string, len(held))
	rail := make(map[string]int, len(held)) // id -> the rail Allocate bound it to
	_, down, _ := p.health.get()
	for _, h := range held {
		if checkDevices(h.IDs, p.n) == nil {
			id := AllocationID(&p.key, h.IDs)
			live[id] = len(h.IDs)
			owner[id] = h.Pod
			rail[id] = p.topo.railOf(h.IDs, down)
		}
	}
	als, err := p.opts.Agent.ListAllocations(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	keep := make(map[string]int, len(als)) // the allocations kept, with their vconns
	var deleted []string
	var errs []error
	allocated := 0
	for _, al := range als {
		if !strings.HasPrefix(al.ID, allocPrefix) {
			continue
		}
		if _, ok := live[al.ID]; ok || p.recent(al.ID) {
			allocated += al.VConns
			keep[al.ID] = al.VConns
			// The agent lets a pod's allocation listen and dial only as
			// its pod, which it learns here.
			if pod := owner[al.ID]; pod != "" && pod != al.Pod {
				if err := p.opts.Agent.BindAllocation(ctx, al.ID, pod); err != nil {
					errs = append(errs, err)
				} else {
					p.log.Info("Bound an allocation to its pod", "allocation", al.ID, "pod", pod)
				}
			}
			continue
		}
		if err := p.opts.Agent.DeleteAllocation(ctx, al.ID); err != nil && !errors.Is(err, admin.ErrNotFound) {
			errs = append(errs, err)
			allocated += al.VConns
			keep[al.ID] = al.VConns
			continue
		}
		p.mu.Lock()
		delete(p.created, al.ID)
		p.mu.Unlock()
		deleted = append(deleted, al.ID)
		p.metrics.collected.Inc()
		p.log.Info("Deleted an allocation no pod holds", "allocation", al.ID, "vconns", al.VConns, "inUse", al.InUse)
	}
	present := make(map[string]bool, len(als))
	for _, al := range als {
		present[al.ID] = true
	}
	for id, k := range live {
		if present[id] {
			continue
		}
		err := p.create(ctx, id, k, rail[id])
		if err == nil {
			err = p.opts.Agent.BindAllocation(ctx, id, owner[id])
		}
		switch {
		case err == nil:
			p.log.Info("Re-created the allocation of a running pod: the agent had lost it", "allocation", id, "vconns", k, "rail", rail[id])
			p.metrics.recreated.Inc()
			allocated += k
			keep[id] = k
		case errors.Is(err, admin.ErrExists): // Allocate made it since the listing
			keep[id] = k
		default:
			errs = append(errs, err)
		}
	}
	// Forget creation times of allocations that are gone.
	p.mu.Lock()
	for id, t := range p.created {
		if !present[id] && now.Sub(t) >= p.opts.GCGrace {
			delete(p.created, id)
		}
	}
	p.mu.Unlock()
	p.metrics.allocated.Set(float64(allocated))
	if err := p.syncSpecs(keep); err != nil {
		errs = append(errs, err)
	}
	return deleted, errors.Join(errs...)
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
