package controllers

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// renderLimits sets the agent configuration's limits from spec.limits;
// an absent field keeps the agent's default (rates: unlimited).
func renderLimits(l *v1alpha1.Limits, out *config.Limits) {
	if l == nil {
		return
	}
	for _, f := range []struct {
		in  *int32
		out *int
	}{{l.Sessions, &out.Sessions}, {l.Listeners, &out.Listeners}, {l.Regions, &out.Regions}, {l.MessageRate, &out.MessageRate}} {
		if f.in != nil {
			*f.out = int(*f.in)
		}
	}
	for _, f := range []struct {
		in  *resource.Quantity
		out *int64
	}{{l.RegionSize, &out.RegionBytes}, {l.QueuedSize, &out.QueuedBytes}, {l.RegisteredSize, &out.RegisteredBytes}, {l.ByteRate, &out.ByteRate}} {
		if f.in != nil {
			*f.out = f.in.Value()
		}
	}
}

// validateLimits repeats the schema's bounds on spec.limits, for an
// object stored past them: the agents would refuse the configuration and
// stop serving every tenant of the nodes. Each error names its field.
func validateLimits(l *v1alpha1.Limits) []error {
	if l == nil {
		return nil
	}
	var errs []error
	for _, f := range []struct {
		name      string
		v         *int32
		least, at int64
	}{
		{"sessions", l.Sessions, 1, config.MaxSessions},
		{"listeners", l.Listeners, 1, config.MaxListeners},
		{"regions", l.Regions, 1, config.MaxRegions},
		{"messageRate", l.MessageRate, 0, config.MaxMessageRate},
	} {
		if f.v != nil && (int64(*f.v) < f.least || int64(*f.v) > f.at) {
			errs = append(errs, fmt.Errorf("spec.limits.%s must be between %d and %d, got %d", f.name, f.least, f.at, *f.v))
		}
	}
	for _, f := range []struct {
		name      string
		v         *resource.Quantity
		least, at int64
	}{
		{"regionSize", l.RegionSize, 1, config.MaxRegionBytes},
		{"queuedSize", l.QueuedSize, config.MinQueuedBytes, config.MaxQueuedBytes},
		{"registeredSize", l.RegisteredSize, 1, config.MaxRegisteredBytes},
		{"byteRate", l.ByteRate, 0, config.MaxByteRate},
	} {
		if f.v == nil {
			continue
		}
		// A fraction of a byte (1500m) is no size: Value would round it up.
		if n, ok := f.v.AsInt64(); !ok || n < f.least || n > f.at {
			errs = append(errs, fmt.Errorf("spec.limits.%s must be a whole number of bytes between %s and %s, got %s",
				f.name, resource.NewQuantity(f.least, resource.BinarySI), resource.NewQuantity(f.at, resource.BinarySI), f.v.String()))
		}
	}
	return errs
}
