package dra

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/cdispec"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
)

// Defaults of Options.
const (
	DefaultDriverName     = "rdmavisor.io"
	DefaultSyncInterval   = 10 * time.Second
	DefaultRequestTimeout = 10 * time.Second
	// CDIKind is the CDI kind of the claims' devices.
	CDIKind = "rdmavisor.io/claim"
	// ContainerSocketDir is where a container sees its allocation's
	// directory, as with the device plugin.
	ContainerSocketDir = "/var/run/rdmavisor"
)

// allocPrefix starts the id of every allocation the driver makes; only
// these are its to delete.
const allocPrefix = "dra-"

// KeyFileFor is the default KeyFile of the driver named driver: in its
// plugin directory of the kubelet's (kubeletplugin's default), which is
// the driver's own, on the host's disk, and mounted into its container.
func KeyFileFor(driver string) string {
	return filepath.Join(kubeletplugin.KubeletPluginsDir, driver, deviceplugin.KeyFile)
}

// Annotations of a claim's CDI device: the driver's record of an
// allocation (see the package documentation).
const (
	annotationPod    = "rdmavisor.io/pod"
	annotationVConns = "rdmavisor.io/vconns"
	// annotationRail is the agent's rail the allocation is bound to
	// (multi-rail); absent for rail 0.
	annotationRail = "rdmavisor.io/rail"
)

// Options configure a Driver.
type Options struct {
	// DriverName is the DRA driver's name (default DefaultDriverName).
	DriverName string
	// NodeName names the node's pool.
	NodeName string
	// SocketDir is the agent's socket directory: an allocation's is
	// <SocketDir>/alloc/<id> on the host.
	SocketDir string
	// Agent is the node agent (deviceplugin.AdminAgent; allocations on
	// rails other than 0 need an admin.RailAgent).
	Agent admin.Agent
	// Rails are the node's RDMA devices as sysfs lists them: they locate
	// the agent's device (NUMA node, PCI root).
	Rails []rdmadev.Device
	// CDISpecDir is where the claims' CDI specs are written (default
	// cdispec.DefaultDir).
	CDISpecDir string
	// KeyFile holds the secret the allocation ids are keyed with
	// (deviceplugin.LoadOrCreateKey: made once, mode 0600, and read back
	// at every start, so that a restarted driver maps a claim to the same
	// id); required (KeyFileFor is the command's default).
	KeyFile string
	// Version is the version attribute, semantic (default: the module's,
	// or 0.0.0-devel).
	Version string
	// SyncInterval spaces the agent probes that publish the devices and
	// restore or collect allocations.
	SyncInterval   time.Duration
	RequestTimeout time.Duration
	Log            logr.Logger
}

// Driver implements kubeletplugin.DRAPlugin over the node agent.
type Driver struct {
	opts  Options
	specs cdispec.Specs
	key   deviceplugin.Key // of the allocation ids (allocationID)
	log   logr.Logger

	// mu serializes Prepare, Unprepare and sync: each reads and writes
	// the agent's allocations and the specs as one step.
	mu sync.Mutex

	hmu sync.Mutex
	// endpoints are the agent's endpoints as it last reported them, those
	// of rails that are down too: their health is reported, and a claim
	// on one is refused with the reason. Guarded by hmu.
	endpoints []Endpoint
	// published are the endpoints last published (those up), once
	// publishedOnce. Guarded by hmu.
	published     []Endpoint
	publishedOnce bool
	ready         bool // the agent's last answer; guarded by hmu

	fatal chan error // HandleError's unrecoverable errors, for Run; buffered 1
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New checks the options and fills their defaults.
func New(o Options) (*Driver, error) {
	if o.NodeName == "" || o.SocketDir == "" || o.Agent == nil {
		return nil, errors.New("dra: want a node name, the agent's socket directory and an agent")
	}
	if o.DriverName == "" {
		o.DriverName = DefaultDriverName
	}
	if o.Version == "" {
		o.Version = moduleVersion()
	}
	if o.SyncInterval <= 0 {
		o.SyncInterval = DefaultSyncInterval
	}
	if o.RequestTimeout <= 0 {
		o.RequestTimeout = DefaultRequestTimeout
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	specs, err := cdispec.New(o.CDISpecDir, CDIKind)
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	if o.KeyFile == "" {
		return nil, errors.New("dra: want the file of the allocation ids' key (KeyFile)")
	}
	key, created, err := deviceplugin.LoadOrCreateKey(o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	if created {
		o.Log.Info("Created the key of the claims' allocation ids", "file", o.KeyFile)
	}
	return &Driver{opts: o, specs: specs, key: key, log: o.Log, fatal: make(chan error, 1)}, nil
}

// allocationID is the id of a claim's agent allocation: allocPrefix and
// 32 hex digits keyed by the driver's key (deviceplugin.KeyedID). A claim's
// UID is in the API for anyone who may read the claim; the id is a
// capability on the allocation's socket path, so it is not derived from
// the UID alone.
func (d *Driver) allocationID(claim types.UID) string {
	return deviceplugin.KeyedID(&d.key, allocPrefix, string(claim))
}

// legacyID is the id an older driver gave a claim's allocation, its UID
// in the clear: Unprepare removes it too, so that a claim prepared before
// the upgrade leaves nothing behind.
func legacyID(claim types.UID) string { return allocPrefix + string(claim) }

// PrepareResourceClaims prepares each claim on its own: one claim's
// failure is its own result.
func (d *Driver) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		devs, err := d.prepare(ctx, c)
		if err != nil {
			d.log.Error(err, "Cannot prepare a claim", "claim", c.Namespace+"/"+c.Name, "uid", c.UID)
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs, Err: err}
	}
	return out, nil
}

func (d *Driver) prepare(ctx context.Context, c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	pod, err := claimPod(c)
	if err != nil {
		return nil, err
	}
	// One allocation for all the claim's results: a container has one
	// socket directory, so what several requests (or an extended
	// resource's count) consume adds up to one quota.
	k := 0
	var results []resourceapi.DeviceRequestAllocationResult
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != d.opts.DriverName {
			continue
		}
		n, err := consumed(r)
		if err != nil {
			return nil, fmt.Errorf("claim %s/%s, request %s: %w", c.Namespace, c.Name, r.Request, err)
		}
		k += n
		results = append(results, r)
	}
	if len(results) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(ctx, d.opts.RequestTimeout)
	defer cancel()
	id := d.allocationID(c.UID)
	// The allocation goes on the rail of the claim's first device (one
	// socket, one engine); the scheduler chose it, by the claim's
	// selectors (numaNode, pciRoot).
	ep, _ := d.endpoint(results[0].Device)
	rail := ep.Rail
	if ep.Down != "" {
		// The scheduler allocated it before the device left the slice.
		return nil, fmt.Errorf("claim %s/%s: device %s (rail %d, %s) is down: %s; its vconns cannot be prepared until the rail is up again",
			c.Namespace, c.Name, ep.Name, ep.Rail, ep.DeviceName, ep.Down)
	}
	isNew, err := d.ensure(ctx, id, k, pod, rail)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if err := d.specs.Write(id, d.edits(id, k, pod, rail)); err != nil {
		if isNew {
			d.release([]string{id})
		}
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	devs := make([]kubeletplugin.Device, len(results))
	for i, r := range results {
		devs[i] = kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, ShareID: r.ShareID}
	}
	// The CDI device once: the container gets the allocation once.
	devs[0].CDIDeviceIDs = []string{d.specs.Device(id)}
	d.log.Info("Prepared a claim's vconns", "claim", c.Namespace+"/"+c.Name, "allocation", id, "vconns", k, "pod", pod, "rail", rail, "new", isNew)
	return devs, nil
}

// claimPod is the one pod a claim is reserved for, "namespace/name": the
// agent lets an allocation listen and dial only as one pod.
func claimPod(c *resourceapi.ResourceClaim) (string, error) {
	var pods []string
	for _, ref := range c.Status.ReservedFor {
		if ref.APIGroup == "" && ref.Resource == "pods" {
			pods = append(pods, c.Namespace+"/"+ref.Name)
		}
	}
	if len(pods) != 1 {
		return "", fmt.Errorf("claim %s/%s is reserved for %d pods (%s): an RDMAvisor allocation serves exactly one pod; give each pod its own claim (a ResourceClaimTemplate)",
			c.Namespace, c.Name, len(pods), strings.Join(pods, ", "))
	}
	return pods[0], nil
}

// consumed is the vconns an allocation result consumes of its device.
func consumed(r resourceapi.DeviceRequestAllocationResult) (int, error) {
	q, ok := r.ConsumedCapacity[CapacityVConns]
	if !ok {
		return 0, fmt.Errorf("device %s consumes no %q capacity: is the DRAConsumableCapacity feature on?", r.Device, CapacityVConns)
	}
	k, ok := q.AsInt64()
	if !ok || k < 1 || k > 1<<20 {
		return 0, fmt.Errorf("device %s: %s vconns: want a whole number of at least 1", r.Device, q.String())
	}
	return int(k), nil
}

// ensure creates allocation id of k vconns for pod, or finds it made by
// an earlier try of the same prepare.
func (d *Driver) ensure(ctx context.Context, id string, k int, pod string, rail int) (isNew bool, _ error) {
	var err error
	if ra, ok := d.opts.Agent.(admin.RailAgent); ok && rail > 0 {
		_, err = ra.CreateRailAllocation(ctx, id, k, rail)
	} else {
		_, err = d.opts.Agent.CreateAllocation(ctx, id, k)
	}
	switch {
	case err == nil:
		isNew = true
	case errors.Is(err, admin.ErrExists):
		als, err := d.opts.Agent.ListAllocations(ctx)
		if err != nil {
			return false, fmt.Errorf("allocation %s: %w", id, err)
		}
		i := slices.IndexFunc(als, func(a admin.Allocation) bool { return a.ID == id })
		if i < 0 || als[i].VConns != k {
			return false, fmt.Errorf("allocation %s exists with another quota", id)
		}
	default:
		return false, fmt.Errorf("allocation %s of %d vconns: %w", id, k, err)
	}
	if err := d.opts.Agent.BindAllocation(ctx, id, pod); err != nil {
		if isNew {
			d.release([]string{id})
		}
		return false, fmt.Errorf("binding allocation %s to %s: %w", id, pod, err)
	}
	return isNew, nil
}

// edits are what a container of the claim gets: as a device-plugin
// container, the allocation's directory and the pod protocol's
// environment; the annotations record the allocation for sync.
func (d *Driver) edits(id string, k int, pod string, rail int) cdispec.Edits {
	e := cdispec.Edits{
		Env: map[string]string{
			frame.EnvSocket: ContainerSocketDir + "/" + admin.SocketName,
			frame.EnvVConns: strconv.Itoa(k),
		},
		Mounts:      []cdispec.Mount{{HostPath: filepath.Join(d.opts.SocketDir, "alloc", id), ContainerPath: ContainerSocketDir, ReadOnly: true}},
		Annotations: map[string]string{annotationPod: pod, annotationVConns: strconv.Itoa(k)},
	}
	if rail > 0 {
		e.Annotations[annotationRail] = strconv.Itoa(rail)
	}
	return e
}

// endpoint is the agent's endpoint of the device name, published or down;
// not found, it is rail 0's zero Endpoint (the scheduler's view may be
// older than the agent's last report).
func (d *Driver) endpoint(name string) (Endpoint, bool) {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	for _, e := range d.endpoints {
		if e.Name == name {
			return e, true
		}
	}
	return Endpoint{}, false
}

// railDown is why the agent's rail is down, "" when it is up or unknown.
func (d *Driver) railDown(rail int) string {
	d.hmu.Lock()
	defer d.hmu.Unlock()
	for _, e := range d.endpoints {
		if e.Rail == rail {
			return e.Down
		}
	}
	return ""
}

// release deletes allocations and their specs, logging what fails: the
// next sync retries.
func (d *Driver) release(ids []string) {
	ctx, cancel := context.WithTimeout(context.Background(), d.opts.RequestTimeout)
	defer cancel()
	for _, id := range ids {
		if err := d.opts.Agent.DeleteAllocation(ctx, id); err != nil && !errors.Is(err, admin.ErrNotFound) {
			d.log.Error(err, "Cannot delete an allocation; the next sync will", "allocation", id)
		}
		if err := d.specs.Remove(id); err != nil {
			d.log.Error(err, "Cannot remove a CDI spec", "allocation", id)
		}
	}
}

// UnprepareResourceClaims deletes the claims' allocations and specs. A
// claim with none (never prepared, or unprepared already) is done.
func (d *Driver) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, d.opts.RequestTimeout)
	defer cancel()
	als, err := d.opts.Agent.ListAllocations(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing the agent's allocations: %w", err)
	}
	specs, err := d.specs.Names()
	if err != nil {
		return nil, err
	}
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		ids := []string{d.allocationID(c.UID), legacyID(c.UID)}
		var errs []error
		for _, al := range als {
			if !slices.Contains(ids, al.ID) {
				continue
			}
			if err := d.opts.Agent.DeleteAllocation(ctx, al.ID); err != nil && !errors.Is(err, admin.ErrNotFound) {
				errs = append(errs, fmt.Errorf("deleting allocation %s: %w", al.ID, err))
				continue
			}
			d.log.Info("Released a claim's vconns", "claim", c.Namespace+"/"+c.Name, "allocation", al.ID, "vconns", al.VConns)
		}
		if len(errs) == 0 { // keep the record while an allocation may remain
			for _, id := range ids {
				if !slices.Contains(specs, id) {
					continue
				}
				if err := d.specs.Remove(id); err != nil {
					errs = append(errs, err)
				}
			}
		}
		out[c.UID] = errors.Join(errs...)
	}
	return out, nil
}

// HandleError logs errors of the background work (publishing slices);
// one that retrying cannot cure (a slice the API server refuses) ends
// Run.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	recoverable := errors.Is(err, kubeletplugin.ErrRecoverable)
	d.log.Error(err, msg, "recoverable", recoverable)
	if !recoverable {
		select {
		case d.fatal <- fmt.Errorf("%s: %w", msg, err):
		default:
		}
	}
}
