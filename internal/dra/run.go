package dra

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// Run registers the driver with the kubelet (the kubeletplugin helper's
// defaults: /var/lib/kubelet/plugins_registry and plugins/<driver>, plus
// opts) and serves it until ctx ends: it publishes the node's pool as the
// agent reports its device, and syncs allocations every SyncInterval.
func (d *Driver) Run(ctx context.Context, kube kubernetes.Interface, opts ...kubeletplugin.Option) error {
	helper, err := kubeletplugin.Start(ctx, d, append([]kubeletplugin.Option{
		kubeletplugin.DriverName(d.opts.DriverName), kubeletplugin.NodeName(d.opts.NodeName), kubeletplugin.KubeClient(kube),
	}, opts...)...)
	if err != nil {
		return fmt.Errorf("dra: starting the kubelet plugin: %w", err)
	}
	defer helper.Stop()
	d.log.Info("Registered the DRA driver", "driver", d.opts.DriverName, "node", d.opts.NodeName)
	return d.loop(ctx, helper.PublishResources)
}

// loop syncs and publishes until ctx ends or a fatal error.
func (d *Driver) loop(ctx context.Context, publish func(context.Context, resourceslice.DriverResources) error) error {
	t := time.NewTicker(d.opts.SyncInterval)
	defer t.Stop()
	for {
		if err := d.Sync(ctx, publish); err != nil && ctx.Err() == nil {
			d.log.Error(err, "Sync failed; will retry", "in", d.opts.SyncInterval)
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-d.fatal:
			return fmt.Errorf("dra: %w", err)
		case <-t.C:
		}
	}
}

// Sync asks the agent for its state, publishes the node's pool when its
// endpoints changed, and makes the agent's "dra-" allocations those the
// specs record: it re-creates the ones a restarted agent lost and deletes
// the ones no spec records.
func (d *Driver) Sync(ctx context.Context, publish func(context.Context, resourceslice.DriverResources) error) error {
	ctx, cancel := context.WithTimeout(ctx, d.opts.RequestTimeout)
	defer cancel()
	st, err := d.opts.Agent.Status(ctx)
	d.hmu.Lock()
	d.ready = err == nil && st.Ready
	d.hmu.Unlock()
	if err != nil {
		return fmt.Errorf("agent status: %w", err)
	}
	if eps := Endpoints(st, d.opts.Rails); len(eps) > 0 {
		if err := d.publish(ctx, eps, publish); err != nil {
			return err
		}
	}
	return d.syncAllocations(ctx)
}

// publish records the agent's endpoints eps and publishes those up when
// they are not what was published last. A rail that is down is left out
// of the slice, so that no claim is allocated on it whatever the
// cluster's feature gates (device taints are gated); its device's health
// is still reported (healthReport).
func (d *Driver) publish(ctx context.Context, eps []Endpoint, publish func(context.Context, resourceslice.DriverResources) error) error {
	up := slices.DeleteFunc(slices.Clone(eps), func(e Endpoint) bool { return e.Down != "" })
	d.hmu.Lock()
	old, same := d.endpoints, d.publishedOnce && slices.Equal(up, d.published)
	d.endpoints = eps
	d.hmu.Unlock()
	d.railsChanged(old, eps)
	if same {
		return nil
	}
	if err := publish(ctx, d.resources(up)); err != nil {
		return fmt.Errorf("publishing the node's devices: %w", err)
	}
	d.hmu.Lock()
	d.published, d.publishedOnce = up, true
	d.hmu.Unlock()
	if len(up) == 0 {
		d.log.Info("Published the node's pool without devices: every rail is down", "down", len(eps))
		return nil
	}
	d.log.Info("Published the node's devices", "devices", len(up), "down", len(eps)-len(up), "device", up[0].Name,
		"transport", up[0].Transport, "vconns", up[0].VConns)
	return nil
}

// railsChanged logs each endpoint that went down or came back up between
// the agent's reports old and eps.
func (d *Driver) railsChanged(old, eps []Endpoint) {
	for _, e := range eps {
		was := ""
		if i := slices.IndexFunc(old, func(o Endpoint) bool { return o.Name == e.Name }); i >= 0 {
			was = old[i].Down
		}
		switch {
		case e.Down != "" && e.Down != was:
			d.log.Info("A rail is down: its device is withdrawn from the node's ResourceSlice and reported unhealthy",
				"device", e.Name, "rail", e.Rail, "rdmaDevice", e.DeviceName, "reason", e.Down)
		case e.Down == "" && was != "":
			d.log.Info("A rail is up again: its device is published and healthy", "device", e.Name, "rail", e.Rail,
				"rdmaDevice", e.DeviceName, "was", was)
		}
	}
}

// resources is the node's pool: one slice of every endpoint's device.
func (d *Driver) resources(eps []Endpoint) resourceslice.DriverResources {
	devs := make([]resourceapi.Device, len(eps))
	for i, e := range eps {
		devs[i] = e.device(d.opts.Version)
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		d.opts.NodeName: {Slices: []resourceslice.Slice{{Devices: devs}}},
	}}
}

func (d *Driver) syncAllocations(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	als, err := d.opts.Agent.ListAllocations(ctx)
	if err != nil {
		return fmt.Errorf("listing the agent's allocations: %w", err)
	}
	names, err := d.specs.Names()
	if err != nil {
		return err
	}
	recorded := make(map[string]bool, len(names))
	var errs []error
	for _, id := range names {
		if !strings.HasPrefix(id, allocPrefix) {
			continue
		}
		recorded[id] = true
		if slices.ContainsFunc(als, func(a admin.Allocation) bool { return a.ID == id }) {
			continue
		}
		e, err := d.specs.Read(id)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		k, err := strconv.Atoi(e.Annotations[annotationVConns])
		pod := e.Annotations[annotationPod]
		if err != nil || k < 1 || pod == "" {
			errs = append(errs, fmt.Errorf("the CDI spec of %s records no pod and vconns", id))
			continue
		}
		rail, _ := strconv.Atoi(e.Annotations[annotationRail]) // absent: rail 0
		if why := d.railDown(rail); why != "" {
			errs = append(errs, fmt.Errorf("allocation %s of %s is lost and its rail %d is down (%s): re-created once the rail is up", id, pod, rail, why))
			continue
		}
		if _, err := d.ensure(ctx, id, k, pod, rail); err != nil {
			errs = append(errs, err)
			continue
		}
		d.log.Info("Re-created a prepared claim's allocation: the agent had lost it", "allocation", id, "vconns", k, "pod", pod)
	}
	for _, al := range als {
		if !strings.HasPrefix(al.ID, allocPrefix) || recorded[al.ID] {
			continue
		}
		if err := d.opts.Agent.DeleteAllocation(ctx, al.ID); err != nil && !errors.Is(err, admin.ErrNotFound) {
			errs = append(errs, fmt.Errorf("deleting allocation %s: %w", al.ID, err))
			continue
		}
		d.log.Info("Deleted an allocation no prepared claim records", "allocation", al.ID, "vconns", al.VConns)
	}
	return errors.Join(errs...)
}

// WatchHealthStatus reports every device of the agent Healthy while the
// agent is ready and its rail up, and Unhealthy, with why, while it is
// not (a device that is down stays reported, though not published: pods
// that hold it see it in their resource health status), every
// SyncInterval (within the kubelet's 30 s timeout) until ctx ends.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	t := time.NewTicker(min(d.opts.SyncInterval, 10*time.Second))
	defer t.Stop()
	for {
		if r := d.healthReport(); len(r.Devices) > 0 {
			select {
			case <-ctx.Done():
				return nil
			case reports <- r:
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (d *Driver) healthReport() kubeletplugin.DeviceHealthReport {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	now := time.Now()
	var r kubeletplugin.DeviceHealthReport
	for _, e := range d.endpoints {
		h, msg := kubeletplugin.HealthStatusHealthy, ""
		switch {
		case !d.ready:
			h, msg = kubeletplugin.HealthStatusUnhealthy, "the node agent is not ready"
		case e.Down != "":
			h, msg = kubeletplugin.HealthStatusUnhealthy, fmt.Sprintf("rail %d (%s) is down: %s", e.Rail, e.DeviceName, e.Down)
		}
		r.Devices = append(r.Devices, kubeletplugin.DeviceHealth{PoolName: d.opts.NodeName, DeviceName: e.Name, Health: h,
			LastUpdated: now, HealthCheckTimeout: 30 * time.Second, Message: msg})
	}
	return r
}

// moduleVersion is the binary's module version when it is semantic, else
// 0.0.0-devel (a build from a work tree).
func moduleVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		v := strings.TrimPrefix(bi.Main.Version, "v")
		if _, err := version.ParseSemantic(v); err == nil {
			return v
		}
	}
	return "0.0.0-devel"
}
