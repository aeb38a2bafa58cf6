package deviceplugin

import (
	"errors"
	"fmt"

	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/cdispec"
)

// edits are what a container gets through the CDI device of its
// allocation: exactly the Allocate response's environment and mounts, so
// that both ways into a container agree.
func edits(r *pluginapi.ContainerAllocateResponse) cdispec.Edits {
	e := cdispec.Edits{Env: r.GetEnvs()}
	for _, m := range r.GetMounts() {
		e.Mounts = append(e.Mounts, cdispec.Mount{HostPath: m.GetHostPath(), ContainerPath: m.GetContainerPath(), ReadOnly: m.GetReadOnly()})
	}
	return e
}

// writeSpec writes the CDI spec of allocation id when CDI is on.
func (p *Plugin) writeSpec(id string, r *pluginapi.ContainerAllocateResponse) error {
	if p.cdi == nil {
		return nil
	}
	return p.cdi.Write(id, edits(r))
}

// syncSpecs, with CDI on, makes the specs on disk those of the
// allocations the device plugin keeps (id -> vconns): it writes the
// missing ones (a spec directory on tmpfs, wiped) and removes those of
// allocations gone, except an allocation this process made within
// GCGrace (an Allocate may have written it after keep was listed).
func (p *Plugin) syncSpecs(keep map[string]int) error {
	if p.cdi == nil {
		return nil
	}
	names, err := p.cdi.Names()
	if err != nil {
		return err
	}
	var errs []error
	onDisk := make(map[string]bool, len(names))
	for _, id := range names {
		onDisk[id] = true
		if _, ok := keep[id]; ok || p.recent(id) {
			continue
		}
		if err := p.cdi.Remove(id); err != nil {
			errs = append(errs, err)
			continue
		}
		p.log.Info("Removed the CDI spec of an allocation that is gone", "allocation", id)
	}
	for id, k := range keep {
		if onDisk[id] {
			continue
		}
		if err := p.writeSpec(id, p.containerResponse(id, k)); err != nil {
			errs = append(errs, err)
			continue
		}
		p.log.Info("Wrote the missing CDI spec of an allocation", "allocation", id)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("CDI specs: %w", err)
	}
	return nil
}
