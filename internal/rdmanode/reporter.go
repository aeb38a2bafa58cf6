// Package rdmanode joins a node agent to its Kubernetes cluster through
// RDMANode objects: the Reporter writes the agent's own RDMANode (readiness,
// device, address, load and a heartbeat, which the operator aggregates into
// the RDMAService's status), and Discovery finds the peer agents of the same
// RDMAService from theirs.
//
// An agent may write only the RDMANode named after its node (the operator's
// admission policy enforces it), so each object has one writer and plain
// updates with optimistic concurrency are enough.
package rdmanode

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// Condition reasons the reporter writes. When the device does not open,
// Ready and DeviceReady are False with the reason the error names (the
// device package's reasons: DeviceNotFound, PortDown, InvalidGIDIndex,
// ...), or ReasonDeviceOpenFailed.
const (
	ReasonServing          = "Serving"
	ReasonStarting         = "Starting"
	ReasonStopped          = "AgentStopped"
	ReasonDeviceOpen       = "DeviceOpen"
	ReasonDeviceOpenFailed = "DeviceOpenFailed"
	// ReasonDevicesDown: every device (rail) the agent serves is down
	// (its port not ACTIVE, or gone); DeviceReady is False with it.
	ReasonDevicesDown = "DevicesDown"
	// PeersReachable's reasons.
	ReasonPeersAnswer     = "PeersAnswer"
	ReasonPeerUnreachable = "PeerUnreachable"
)

// Source is what the reporter reports: the agent.
type Source interface {
	Status() admin.Status
}

// DeviceSource is a Source that may be waiting for its device: DeviceError
// says why the device does not open (nil once it has, or while unknown).
type DeviceSource interface {
	Source
	DeviceError() error
}

// Pending is the Source of a node agent that cannot start yet: its device
// does not open. Fail records the latest error; Start hands the report over
// to the running agent. Safe for concurrent use.
type Pending struct {
	mu  sync.Mutex
	err error  // guarded by mu
	src Source // guarded by mu; nil until Start
}

// Fail records why the device does not open.
func (p *Pending) Fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.err = err
}

// Start reports src from now on.
func (p *Pending) Start(src Source) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.src, p.err = src, nil
}

// Status is the agent's, or an agent not ready while there is none.
func (p *Pending) Status() admin.Status {
	p.mu.Lock()
	src := p.src
	p.mu.Unlock()
	if src == nil {
		return admin.Status{}
	}
	return src.Status()
}

// DeviceError is the last Fail's error until Start.
func (p *Pending) DeviceError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Reporter keeps the RDMANode of one node up to date.
type Reporter struct {
	Client client.Client
	// Kube is the typed clientset of the same API server, for Events.
	Kube     kubernetes.Interface
	Node     string
	Service  string
	Provider v1alpha1.Provider
	Log      logr.Logger
	// Heartbeat is how often the status is written even when nothing
	// changed (default 30s; the operator's timeout is 90s).
	Heartbeat time.Duration
	// Poll is how often the agent's state is compared with the last
	// report (default 2s).
	Poll time.Duration

	events *nodeEvents // condition changes as Events, when Kube is set (Run)
}

// Run reports until ctx ends, then marks the node not ready, so the
// operator and peers see a stopped agent at once rather than after the
// heartbeat timeout.
func (r *Reporter) Run(ctx context.Context, src Source) {
	if r.Kube != nil {
		r.events = newNodeEvents(ctx, r.Kube)
	}
	heartbeat, poll := r.Heartbeat, r.Poll
	if heartbeat <= 0 {
		heartbeat = 30 * time.Second
	}
	if poll <= 0 {
		poll = 2 * time.Second
	}
	var last *v1alpha1.RDMANodeStatus
	var written time.Time
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		st := r.status(src.Status(), deviceError(src), metav1.Now())
		if last == nil || !sameReport(last, &st) || time.Since(written) >= heartbeat {
			if err := r.Write(ctx, st); err != nil {
				if ctx.Err() == nil {
					r.Log.Error(err, "Cannot write the RDMANode; retrying", "node", r.Node)
				}
			} else {
				last, written = &st, time.Now()
			}
		}
		select {
		case <-ctx.Done():
			stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 3*time.Second)
			defer cancel()
			st := r.status(src.Status(), deviceError(src), metav1.Now())
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionNodeReady,
				Status: metav1.ConditionFalse, Reason: ReasonStopped, Message: "the node agent stopped"})
			st.VConnsOpen, st.VConnsAllocated, st.QPsInUse = 0, 0, 0
			// Never recreate it now: the operator may have deleted it
			// because this node left the service.
			if err := r.write(stopCtx, st, false); err != nil && !apierrors.IsNotFound(err) {
				r.Log.Error(err, "Cannot mark the RDMANode not ready", "node", r.Node)
			}
			return
		case <-t.C:
		}
	}
}

func deviceError(src Source) error {
	if d, ok := src.(DeviceSource); ok {
		return d.DeviceError()
	}
	return nil
}

// status renders an agent's state; devErr is why its device does not open.
func (r *Reporter) status(s admin.Status, devErr error, now metav1.Time) v1alpha1.RDMANodeStatus {
	st := v1alpha1.RDMANodeStatus{
		QPsInUse:        int32(s.QPs),
		VConnsAllocated: int32(s.Allocated),
		VConnsOpen:      int32(min(s.VConns, s.Capacity)),
		VConnCapacity:   int32(s.Capacity),
		HeartbeatTime:   &now,
	}
	if s.Device != "" {
		st.Devices = []v1alpha1.RDMADevice{{Name: s.Device, Provider: r.Provider, GID: s.GID, Health: v1alpha1.DeviceHealthy}}
	}
	var down []string // "device (why)" of each rail that is down
	if len(s.Rails) > 0 {
		// A rail is healthy while the agent serves it and its port is up
		// (a device the agent cannot open at all fails the whole agent).
		st.Devices = st.Devices[:0]
		for i, rl := range s.Rails {
			d := v1alpha1.RDMADevice{Name: rl.Device, Provider: r.Provider, GID: rl.GID, Health: v1alpha1.DeviceHealthy,
				Rail: int32(i), VConnsAllocated: int32(rl.Allocated), VConnsOpen: int32(rl.VConns), QPsInUse: int32(rl.QPs)}
			if rl.Down != "" {
				d.Health, d.Message = v1alpha1.DeviceUnhealthy, truncate(rl.Down, maxMessage)
				down = append(down, fmt.Sprintf("%s (%s)", rl.Device, rl.Down))
			}
			if rl.NUMANode >= 0 {
				n := int32(rl.NUMANode)
				d.NUMANode = &n
			}
			st.Devices = append(st.Devices, d)
		}
	}
	if host, port, err := net.SplitHostPort(s.Control); err == nil {
		if p, err := strconv.Atoi(port); err == nil && net.ParseIP(host) != nil && !net.ParseIP(host).IsUnspecified() {
			st.Address = &v1alpha1.AgentAddress{IP: host, ControlPort: int32(p)}
		}
	}
	cond := metav1.Condition{Type: v1alpha1.ConditionNodeReady, Status: metav1.ConditionTrue, Reason: ReasonServing,
		Message: fmt.Sprintf("serving %d vconns over %d QPs", s.VConns, s.QPs)}
	if !s.Ready {
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, ReasonStarting, "the node agent is not ready"
	}
	switch {
	case devErr != nil:
		reason := ReasonDeviceOpenFailed
		var rs interface{ Reason() string }
		if errors.As(devErr, &rs) {
			reason = rs.Reason()
		}
		msg := fmt.Sprintf("cannot open the %s device: %v; retrying", r.Provider, devErr)
		cond.Status, cond.Reason, cond.Message = metav1.ConditionFalse, reason, msg
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionDeviceReady,
			Status: metav1.ConditionFalse, Reason: reason, Message: msg})
	case len(down) > 0 && len(down) == len(s.Rails):
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionDeviceReady,
			Status: metav1.ConditionFalse, Reason: ReasonDevicesDown,
			Message: truncate("every RDMA device is down: "+strings.Join(down, ", "), maxMessage)})
	case s.Device != "":
		msg := fmt.Sprintf("device %s, GID %s", s.Device, s.GID)
		if len(down) > 0 {
			// The node still serves vconns on its other rails.
			msg += fmt.Sprintf("; %d of %d devices down: %s", len(down), len(s.Rails), strings.Join(down, ", "))
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1alpha1.ConditionDeviceReady,
			Status: metav1.ConditionTrue, Reason: ReasonDeviceOpen, Message: truncate(msg, maxMessage)})
	}
	meta.SetStatusCondition(&st.Conditions, cond)
	peers := metav1.Condition{Type: v1alpha1.ConditionPeersReachable, Status: metav1.ConditionTrue, Reason: ReasonPeersAnswer,
		Message: "every peer agent answers"}
	if len(s.Unreachable) > 0 {
		st.UnreachablePeers = s.Unreachable
		peers.Status, peers.Reason = metav1.ConditionFalse, ReasonPeerUnreachable
		peers.Message = "no answer from the agents of " + strings.Join(s.Unreachable, ", ")
	}
	meta.SetStatusCondition(&st.Conditions, peers)
	return st
}

// maxMessage is the most a device's or a condition's message may hold
// (the CRD's bound on a device's; a condition allows far more).
const maxMessage = 1024

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// A rune cut in two is invalid, and dropped.
	return strings.ToValidUTF8(s[:n-len("...")], "") + "..."
}

// sameReport: nothing but the heartbeat and condition times changed.
func sameReport(a, b *v1alpha1.RDMANodeStatus) bool {
	strip := func(s *v1alpha1.RDMANodeStatus) v1alpha1.RDMANodeStatus {
		c := *s.DeepCopy()
		c.HeartbeatTime = nil
		for i := range c.Conditions {
			c.Conditions[i].LastTransitionTime = metav1.Time{}
		}
		return c
	}
	return equality.Semantic.DeepEqual(strip(a), strip(b))
}

// Write creates the node's RDMANode if needed and replaces its status with
// st. A condition keeps its transition time while its status holds.
func (r *Reporter) Write(ctx context.Context, st v1alpha1.RDMANodeStatus) error {
	return r.write(ctx, st, true)
}

func (r *Reporter) write(ctx context.Context, st v1alpha1.RDMANodeStatus, create bool) error {
	var rn v1alpha1.RDMANode
	err := r.Client.Get(ctx, client.ObjectKey{Name: r.Node}, &rn)
	if apierrors.IsNotFound(err) && create {
		rn = v1alpha1.RDMANode{ObjectMeta: metav1.ObjectMeta{Name: r.Node}, Spec: v1alpha1.RDMANodeSpec{ServiceName: r.Service}}
		if err = r.Client.Create(ctx, &rn); err != nil {
			return fmt.Errorf("creating RDMANode %s: %w", r.Node, err)
		}
	} else if err != nil {
		return fmt.Errorf("reading RDMANode %s: %w", r.Node, err)
	}
	if rn.Spec.ServiceName != r.Service {
		// Another service's agent served this node before; the operator
		// deletes its RDMANode when that service lets the node go.
		return fmt.Errorf("RDMANode %s belongs to RDMAService %q, not %q", r.Node, rn.Spec.ServiceName, r.Service)
	}
	before := slices.Clone(rn.Status.Conditions)
	conds := rn.Status.Conditions
	for _, c := range st.Conditions {
		meta.SetStatusCondition(&conds, c)
	}
	rn.Status = st
	rn.Status.Conditions = conds
	if err := r.Client.Status().Update(ctx, &rn); err != nil {
		return fmt.Errorf("updating the status of RDMANode %s: %w", r.Node, err)
	}
	r.events.changed(&rn, before, conds)
	return nil
}
