package rdmanode

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/discovery"
)

// fieldServiceName is the RDMANode CRD's selectable field: the API server
// filters by service, so an agent never reads other services' nodes.
const fieldServiceName = "spec.serviceName"

// Discovery is discovery.Source over the RDMANodes of one RDMAService: a
// peer is another node whose agent reports Ready and an address.
type Discovery struct {
	Client  client.WithWatch
	Service string
	// Self is this agent's node, never its own peer.
	Self string
	Log  logr.Logger

	mu    sync.Mutex
	peers []discovery.Peer // sorted by node name; guarded by mu
}

var _ discovery.Source = (*Discovery)(nil)

// Peers returns the peers known now.
func (d *Discovery) Peers() []discovery.Peer {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.peers)
}

// Watch lists and watches the service's RDMANodes until ctx ends, calling
// fn whenever the peer list changes. A failed list or a closed watch is
// retried after a second, from a fresh list.
func (d *Discovery) Watch(ctx context.Context, fn func([]discovery.Peer)) {
	for ctx.Err() == nil {
		if err := d.run(ctx, fn); err != nil && ctx.Err() == nil {
			d.Log.Error(err, "Watching RDMANodes; retrying", "service", d.Service)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

func (d *Discovery) run(ctx context.Context, fn func([]discovery.Peer)) error {
	sel := client.MatchingFields{fieldServiceName: d.Service}
	var list v1alpha1.RDMANodeList
	if err := d.Client.List(ctx, &list, sel); err != nil {
		return err
	}
	nodes := make(map[string]*v1alpha1.RDMANode, len(list.Items))
	for i := range list.Items {
		nodes[list.Items[i].Name] = &list.Items[i]
	}
	d.update(nodes, fn)
	w, err := d.Client.Watch(ctx, &v1alpha1.RDMANodeList{ListMeta: metav1.ListMeta{ResourceVersion: list.ResourceVersion}}, sel)
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil // the server ended the watch: list again
			}
			switch ev.Type {
			case watch.Added, watch.Modified:
				if rn, ok := ev.Object.(*v1alpha1.RDMANode); ok {
					nodes[rn.Name] = rn
				}
			case watch.Deleted:
				if rn, ok := ev.Object.(*v1alpha1.RDMANode); ok {
					delete(nodes, rn.Name)
				}
			case watch.Error:
				return apierrors.FromObject(ev.Object)
			}
			d.update(nodes, fn)
		}
	}
}

// update recomputes the peers and calls fn if they changed.
func (d *Discovery) update(nodes map[string]*v1alpha1.RDMANode, fn func([]discovery.Peer)) {
	var peers []discovery.Peer
	for name, rn := range nodes {
		if p, ok := peerOf(rn); ok && name != d.Self {
			peers = append(peers, p)
		}
	}
	slices.SortFunc(peers, func(a, b discovery.Peer) int { return strings.Compare(a.NodeName, b.NodeName) })
	d.mu.Lock()
	changed := !slices.EqualFunc(peers, d.peers, discovery.Peer.Equal)
	d.peers = peers
	d.mu.Unlock()
	if changed {
		d.Log.Info("Peer agents changed", "service", d.Service, "peers", len(peers))
		fn(slices.Clone(peers))
	}
}

// peerOf: an RDMANode names a peer when its agent is ready and has an
// address; its devices of rails 1.. give the peer's rail GIDs.
func peerOf(rn *v1alpha1.RDMANode) (discovery.Peer, bool) {
	a := rn.Status.Address
	if a == nil || a.IP == "" || a.ControlPort == 0 ||
		!meta.IsStatusConditionTrue(rn.Status.Conditions, v1alpha1.ConditionNodeReady) {
		return discovery.Peer{}, false
	}
	p := discovery.Peer{NodeName: rn.Name, Address: net.JoinHostPort(a.IP, strconv.Itoa(int(a.ControlPort)))}
	for _, d := range rn.Status.Devices {
		if d.Rail < 1 || d.Rail > config.MaxRails || d.GID == "" {
			continue
		}
		for len(p.RailGIDs) < int(d.Rail) {
			p.RailGIDs = append(p.RailGIDs, "")
		}
		p.RailGIDs[d.Rail-1] = d.GID
	}
	return p, true
}
