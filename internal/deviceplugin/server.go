package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// ContainerSocketDir is where a container sees its allocation's
// directory; RDMAVISOR_SOCKET names the socket in it.
const ContainerSocketDir = "/var/run/rdmavisor"

// server implements the v1beta1 DevicePlugin service.
type server struct {
	pluginapi.UnimplementedDevicePluginServer
	p *Plugin
}

var _ pluginapi.DevicePluginServer = (*server)(nil)

func (p *Plugin) pluginOptions() *pluginapi.DevicePluginOptions {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}
}

// GetDevicePluginOptions: no PreStartContainer, a preferred allocation.
func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return s.p.pluginOptions(), nil
}

// devices lists every device, Healthy while the agent is (healthy) and
// its rail is not down (see health.down), and the NUMA node of its rail
// where that is known.
func (p *Plugin) devices(healthy bool, down []string) []*pluginapi.Device {
	numa := p.topo.nodes()
	out := make([]*pluginapi.Device, p.n)
	for i := range out {
		h := pluginapi.Unhealthy
		if healthy && railDown(down, i*len(down)/p.n) == "" {
			h = pluginapi.Healthy
		}
		out[i] = &pluginapi.Device{ID: DeviceID(i), Health: h}
		if numa != nil && numa[i] >= 0 {
			out[i].Topology = &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(numa[i])}}}
		}
	}
	return out
}

// ListAndWatch sends the devices, then again at every health change,
// until the kubelet hangs up or the server stops.
func (s *server) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	ctx := stream.Context()
	for {
		healthy, down, changed := s.p.health.get()
		if err := stream.Send(&pluginapi.ListAndWatchResponse{Devices: s.p.devices(healthy, down)}); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-changed:
		}
	}
}

// GetPreferredAllocation: see the package documentation. The devices of
// a rail that is down are never preferred (the kubelet may offer them
// before it has the ListAndWatch update that made them Unhealthy); the
// kubelet fills a shorter answer from what it has.
func (s *server) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	rep := &pluginapi.PreferredAllocationResponse{}
	_, down, _ := s.p.health.get()
	for _, cr := range req.GetContainerRequests() {
		available := cr.GetAvailableDeviceIDs()
		if down != nil {
			available = slices.DeleteFunc(slices.Clone(available), func(id string) bool {
				i, ok := deviceIndex(id, s.p.n)
				return ok && railDown(down, i*len(down)/s.p.n) != ""
			})
		}
		ids := preferredNUMA(available, cr.GetMustIncludeDeviceIDs(), int(cr.GetAllocationSize()), s.p.n, s.p.topo.nodes())
		rep.ContainerResponses = append(rep.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return rep, nil
}

// PreStartContainer is not required (see GetDevicePluginOptions).
func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// Allocate creates an allocation per container; see the package
// documentation. Every request is validated before anything is created,
// and allocations made for an earlier container of a failed request are
// deleted again.
func (s *server) Allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	rep, err := s.p.allocate(ctx, req)
	if err != nil {
		s.p.metrics.allocations.WithLabelValues("error").Inc()
		s.p.log.Error(err, "Allocate failed")
		return nil, err
	}
	s.p.metrics.allocations.WithLabelValues("ok").Add(float64(len(rep.ContainerResponses)))
	return rep, nil
}

func (p *Plugin) allocate(ctx context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	crs := req.GetContainerRequests()
	if len(crs) == 0 {
		return nil, status.Error(codes.InvalidArgument, "allocate: no container requests")
	}
	for i, cr := range crs {
		if err := checkDevices(cr.GetDevicesIds(), p.n); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "allocate: container request %d: %v", i, err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	rep := &pluginapi.AllocateResponse{}
	var created []string
	for _, cr := range crs {
		ids := cr.GetDevicesIds()
		id := AllocationID(&p.key, ids)
		_, down, _ := p.health.get()
		rail := p.topo.railOf(ids, down)
		isNew, err := p.ensureAllocation(ctx, id, len(ids), rail)
		if err != nil && railDown(down, rail) != "" {
			// The kubelet gave only devices of a rail that is down (it
			// had not had their Unhealthy yet): the agent refused.
			err = status.Errorf(status.Code(err), "%s: the devices' rail %d is down (%s)", status.Convert(err).Message(), rail, railDown(down, rail))
		}
		if err != nil {
			if rerr := p.rollback(created); rerr != nil {
				p.log.Error(rerr, "Cannot roll back a failed Allocate", "allocations", created)
			}
			return nil, err
		}
		if isNew {
			created = append(created, id)
		}
		r := p.containerResponse(id, len(ids))
		if err := p.writeSpec(id, r); err != nil {
			if rerr := p.rollback(created); rerr != nil {
				p.log.Error(rerr, "Cannot roll back a failed Allocate", "allocations", created)
			}
			return nil, status.Errorf(codes.Internal, "allocate %s: %v", id, err)
		}
		rep.ContainerResponses = append(rep.ContainerResponses, r)
		p.log.Info("Allocated", "allocation", id, "vconns", len(ids), "devices", ids, "rail", rail, "new", isNew)
	}
	p.refreshAllocated(ctx)
	p.bindSoon()
	return rep, nil
}

// bindSoon runs collection a few times in the seconds after an Allocate:
// the kubelet lists the pod's devices once Allocate returned, and the
// agent lets the allocation listen or dial only once collection named its
// pod (it waits for that a few seconds).
func (p *Plugin) bindSoon() {
	// Until the kubelet lists the pod's devices, which on a loaded node
	// came past 2 s (an e2e pod's dials, waiting podWait, failed before the
	// minute's pass bound it): every few seconds for about 20 s.
	for _, d := range []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second,
		3 * time.Second, 5 * time.Second, 8 * time.Second, 13 * time.Second, 21 * time.Second} {
		time.AfterFunc(d, func() {
			select {
			case p.kick <- struct{}{}:
			default:
			}
		})
	}
}

// ensureAllocation creates allocation id of k vconns on rail, or finds it
// made by an earlier try of the same Allocate.
func (p *Plugin) ensureAllocation(ctx context.Context, id string, k, rail int) (isNew bool, _ error) {
	p.mu.Lock()
	p.created[id] = time.Now() // before creating: a GC pass must not race with it
	p.mu.Unlock()
	err := p.create(ctx, id, k, rail)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, admin.ErrExists):
		als, lerr := p.opts.Agent.ListAllocations(ctx)
		if lerr != nil {
			return false, status.Errorf(codes.Unavailable, "allocate %s: %v", id, lerr)
		}
		for _, al := range als {
			if al.ID == id && al.VConns == k {
				return false, nil
			}
		}
		return false, status.Errorf(codes.Internal, "allocate %s: exists with another quota", id)
	case errors.Is(err, admin.ErrQuota):
		return false, status.Errorf(codes.ResourceExhausted, "allocate %s: %v", id, err)
	}
	if ae := (*admin.Error)(nil); errors.As(err, &ae) {
		// The agent answered and refused: retrying will not help.
		return false, status.Errorf(codes.FailedPrecondition, "allocate %s: %v", id, err)
	}
	return false, status.Errorf(codes.Unavailable, "allocate %s: %v", id, err)
}

// create creates allocation id of k vconns on rail.
func (p *Plugin) create(ctx context.Context, id string, k, rail int) error {
	var err error
	if ra, ok := p.opts.Agent.(admin.RailAgent); ok && rail > 0 {
		_, err = ra.CreateRailAllocation(ctx, id, k, rail)
	} else {
		_, err = p.opts.Agent.CreateAllocation(ctx, id, k)
	}
	return err
}

// rollback deletes the allocations an Allocate that failed created.
func (p *Plugin) rollback(ids []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), p.opts.RequestTimeout)
	defer cancel()
	var errs []error
	for _, id := range ids {
		if err := p.opts.Agent.DeleteAllocation(ctx, id); err != nil && !errors.Is(err, admin.ErrNotFound) {
			errs = append(errs, fmt.Errorf("rolling back allocation %s: %w", id, err))
			continue
		}
		if p.cdi != nil {
			if err := p.cdi.Remove(id); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func (p *Plugin) containerResponse(id string, k int) *pluginapi.ContainerAllocateResponse {
	r := &pluginapi.ContainerAllocateResponse{
		Envs: map[string]string{
			frame.EnvSocket: ContainerSocketDir + "/" + admin.SocketName,
			frame.EnvVConns: strconv.Itoa(k),
		},
		// Read-only is enough to connect to a unix socket; the pod cannot
		// put anything beside it.
		Mounts: []*pluginapi.Mount{{
			HostPath:      filepath.Join(p.opts.Config.SocketDir, "alloc", id),
			ContainerPath: ContainerSocketDir,
			ReadOnly:      true,
		}},
	}
	if p.opts.CDI {
		r.CdiDevices = []*pluginapi.CDIDevice{{Name: p.opts.Config.ResourceName + "=" + id}}
	}
	return r
}
