package agent

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// allocation is a share of the node's vconns handed to one pod: a quota
// and a socket of its own, <socketDir>/alloc/<id>/vconn.sock.
type allocation struct {
	a     *Agent
	id    string
	quota int
	dir   string
	path  string
	ln    *net.UnixListener
	done  chan struct{} // closed when the accept loop returned

	mu       sync.Mutex
	used     int                        // vconns open; guarded by mu
	held     held                       // listeners, regions; guarded by mu (limits.go)
	sessions map[*session]struct{}      // guarded by mu
	refusing map[*net.UnixConn]struct{} // past the limit, waiting for refuse; guarded by mu
	bridges  map[*bridge]struct{}       // vconns a program holds as a socket (bridge.go); guarded by mu
	closed   bool                       // guarded by mu

	// podScoped: the allocation is a pod's (the device plugin's): it
	// listens and dials only as pod, the "namespace/name" BindAllocation
	// set. Otherwise it serves host services on the node's port space.
	podScoped bool
	pod       string // guarded by mu
	// told: Options.PodEvents heard of pod's allocation, with its UID;
	// guarded by mu.
	told bool
	// rail is the device whose engine carries the allocation's vconns
	// (Agent.engines).
	rail int
	// rate holds the allocation's sends to limits.messageRate and
	// limits.byteRate (rate.go); nil when both are unlimited.
	rate *rateLimiter

	stats    tenantStats // the pod's traffic and refusals (tenant.go)
	failures failures    // vconns the path failed, to tell the pod (failed.go)
}

// socketMode is the mode of every allocation's socket: connecting needs
// write permission, which only its owner and group get.
const socketMode = 0o660

var allocID = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// CreateAllocation creates an allocation of k vconns and its socket, for
// host services: it listens on the node's own port space ("node:port").
// It is bound to the first rail that is up (pickRail).
func (a *Agent) CreateAllocation(id string, k int) (admin.Allocation, error) {
	return a.createAllocation(id, k, false, 0)
}

// CreatePodAllocation creates an allocation of k vconns for a pod: it
// listens and dials as the pod BindAllocation names, and not before. It
// is bound to the first rail that is up (pickRail).
func (a *Agent) CreatePodAllocation(id string, k int) (admin.Allocation, error) {
	return a.createAllocation(id, k, true, 0)
}

// BindAllocation names the pod (namespace, name) a pod-scoped allocation
// belongs to. The device plugin calls it with what the kubelet's
// pod-resources API says; it may change (the same devices held by a new
// pod of another name), and takes effect for later Listens and Dials.
func (a *Agent) BindAllocation(id, namespace, name string) error {
	if namespace == "" || name == "" {
		return fmt.Errorf("agent: bind allocation %s: namespace and name are required", id)
	}
	a.mu.Lock()
	al := a.allocs[id]
	a.mu.Unlock()
	if al == nil {
		return fmt.Errorf("agent: bind allocation %s: %w", id, admin.ErrNotFound)
	}
	if !al.podScoped {
		return fmt.Errorf("agent: bind allocation %s: it serves host services, not a pod", id)
	}
	pod := namespace + "/" + name
	al.mu.Lock()
	old := al.pod
	al.pod = pod
	if old != pod {
		al.told = false
	}
	al.mu.Unlock()
	if old != pod {
		a.log.Info("Bound an allocation to its pod", "allocation", id, "pod", pod, "was", old)
	}
	if p, ok := a.podRef(namespace, name); ok {
		al.tell(p)
	}
	return nil
}

// tell gives PodEvents the allocation of pod p, once: when the device
// plugin binds it (BindAllocation) or, as the kubelet often binds before
// the pod's network is up, when the CNI plugin registers the pod with its
// UID (RegisterPod), by which kubectl describe finds the pod's Events.
func (al *allocation) tell(p admin.Pod) {
	ev := al.a.opts.PodEvents
	if ev == nil {
		return
	}
	al.mu.Lock()
	if al.told || al.pod != p.Namespace+"/"+p.Name {
		al.mu.Unlock()
		return
	}
	al.told = true
	al.mu.Unlock()
	ev.Allocated(p, al.info())
}

// tellPod gives PodEvents the allocations bound to p before it was
// registered.
func (a *Agent) tellPod(p admin.Pod) {
	if a.opts.PodEvents == nil {
		return
	}
	a.mu.Lock()
	als := slices.Collect(maps.Values(a.allocs))
	a.mu.Unlock()
	for _, al := range als {
		al.tell(p)
	}
}

// PodEvents records what happens to a pod's vconns as Events on the pod.
// It must not block: it runs on the device plugin's requests.
type PodEvents interface {
	Allocated(pod admin.Pod, al admin.Allocation)
	// VConnsFailed: n of the pod's vconns failed because their path did
	// (a peer node or its agent lost, a QP failed: a rail down); why is
	// the first one's error.
	VConnsFailed(pod admin.Pod, n int, why string)
}

// podRef is the pod namespace/name as the CNI plugin registered it, if
// it did.
func (a *Agent) podRef(namespace, name string) (admin.Pod, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range a.pods {
		if p.Namespace == namespace && p.Name == name {
			return p, true
		}
	}
	return admin.Pod{}, false
}

func (a *Agent) createAllocation(id string, k int, podScoped bool, rail int) (admin.Allocation, error) {
	if !allocID.MatchString(id) {
		return admin.Allocation{}, fmt.Errorf("agent: allocation id %q: want lower-case letters, digits and '-', at most 63", id)
	}
	if _, err := a.engineOf(rail); err != nil {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %w", id, err)
	}
	if k < 1 || k > a.cfg.VConnsPerNode {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %d vconns: want 1..%d", id, k, a.cfg.VConnsPerNode)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return admin.Allocation{}, errors.New("agent: shutting down")
	}
	if a.allocs[id] != nil {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %w", id, admin.ErrExists)
	}
	rail, err := a.pickRail(rail)
	if err != nil {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %w", id, err)
	}
	total := k
	for _, al := range a.allocs {
		total += al.quota
	}
	if total > a.cfg.VConnsPerNode {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s of %d vconns: %w (%d of %d allocated)", id, k, admin.ErrQuota, total-k, a.cfg.VConnsPerNode)
	}
	dir := filepath.Join(a.cfg.SocketDir, "alloc", id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %w", id, err)
	}
	// The directory of all allocations may be crossed, not listed, but
	// by root: reaching a socket takes its id, which the device plugin
	// derives with a key only root on the node knows
	// (deviceplugin.AllocationID).
	if err := os.Chmod(filepath.Dir(dir), 0o711); err != nil {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %w", id, err)
	}
	path := filepath.Join(dir, admin.SocketName)
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %w", id, err)
	}
	// Owner and group as configured, no one else: the directory mounted
	// into the pod keeps other pods out, the mode keeps out the node's
	// other users and any container that mounts the socket directory.
	if err := os.Chown(path, a.cfg.SocketUID, a.cfg.SocketGID); err != nil {
		_ = ln.Close()
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: owning the socket: %w", id, err)
	}
	if err := os.Chmod(path, socketMode); err != nil {
		_ = ln.Close()
		return admin.Allocation{}, fmt.Errorf("agent: allocation %s: %w", id, err)
	}
	al := &allocation{a: a, id: id, quota: k, dir: dir, path: path, ln: ln, done: make(chan struct{}), podScoped: podScoped, rail: rail,
		sessions: make(map[*session]struct{}), refusing: make(map[*net.UnixConn]struct{}),
		rate: newRateLimiter(a.cfg.Limits.MessageRate, a.cfg.Limits.ByteRate)}
	a.allocs[id] = al
	go al.serve()
	a.log.Info("Created allocation", "allocation", id, "vconns", k, "socket", path, "podScoped", podScoped, "rail", rail)
	return al.info(), nil
}

// DeleteAllocation closes an allocation's socket and every vconn of it.
func (a *Agent) DeleteAllocation(id string) error {
	a.mu.Lock()
	al := a.allocs[id]
	delete(a.allocs, id)
	a.mu.Unlock()
	if al == nil {
		return fmt.Errorf("agent: allocation %s: %w", id, admin.ErrNotFound)
	}
	al.shutdown(false)
	a.log.Info("Deleted allocation", "allocation", id)
	return nil
}

// Allocations lists the allocations.
func (a *Agent) Allocations() []admin.Allocation {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]admin.Allocation, 0, len(a.allocs))
	for _, al := range a.allocs {
		out = append(out, al.info())
	}
	return out
}

func (al *allocation) info() admin.Allocation {
	al.mu.Lock()
	defer al.mu.Unlock()
	return admin.Allocation{ID: al.id, VConns: al.quota, Socket: al.path, InUse: al.used, Listeners: al.held.listeners, PodScoped: al.podScoped, Pod: al.pod, Rail: al.rail}
}

// take claims a vconn of the quota, for a dial or an accept alike
// (TestQuota and TestAcceptQuota in quota_test.go).
func (al *allocation) take() bool {
	al.mu.Lock()
	defer al.mu.Unlock()
	if al.closed || al.used >= al.quota {
		return false
	}
	al.used++
	return true
}

// give returns a vconn to the quota.
func (al *allocation) give() { al.giveFor(acceptSlot{}) }

// maxRefusing bounds, per allocation, the connections past
// limits.sessions that wait for their first frame to be told why they are
// refused. Past it they are closed at once: a client flooding its
// allocation's socket costs the agent no memory and no goroutine per
// connection, only the fd for as long as the accept takes.
const maxRefusing = 4

// serve accepts the allocation's connections. A connection past
// limits.sessions is refused before anything is allocated for a session
// (a session's read buffer alone is a frame's 64 KiB).
func (al *allocation) serve() {
	defer close(al.done)
	for {
		c, err := al.ln.AcceptUnix()
		if err != nil {
			return
		}
		lim := al.a.cfg.Limits.Sessions
		al.mu.Lock()
		full, tell := len(al.sessions) >= lim, false
		if full && len(al.refusing) < maxRefusing && !al.closed {
			al.refusing[c] = struct{}{}
			tell = true
		}
		al.mu.Unlock()
		if full {
			al.stats.refused(refusedLimit)
		}
		switch {
		case tell:
			go al.refuse(c, lim)
			continue
		case full:
			_ = c.Close()
			continue
		}
		// Only this loop adds sessions: the place checked above is
		// still free.
		s := newSession(al, c)
		al.mu.Lock()
		if al.closed {
			al.mu.Unlock()
			_ = c.Close()
			return
		}
		al.sessions[s] = struct{}{}
		al.mu.Unlock()
		go s.run()
	}
}

// refuse answers a connection past limits.sessions with the limit code
// at its first frame (a hello), so that the application learns why, and
// closes it; it waits at most 5 s for the frame. A frame header holds a
// hello, and what the answer needs of a longer frame (its request id).
func (al *allocation) refuse(c *net.UnixConn, lim int) {
	defer func() {
		al.mu.Lock()
		delete(al.refusing, c)
		al.mu.Unlock()
		_ = c.Close()
	}()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var buf [frame.HeaderLen]byte
	n, err := c.Read(buf[:])
	if err != nil || n == 0 {
		return
	}
	msg := fmt.Sprintf("allocation %s already has %d connections (limits.sessions)", al.id, lim)
	b, err := frame.Append(nil, &frame.Frame{Op: frame.OpError, Req: reqOf(buf[:n]), Arg: uint32(frame.CodeLimit), Payload: []byte(msg)})
	if err == nil {
		_, _ = c.Write(b)
	}
}

// shutdown closes the socket and every session. The directory goes too,
// unless keepDir: when the agent stops (to restart), running pods keep a
// bind mount of it, and the allocation re-created at the same path must
// appear in that mount.
func (al *allocation) shutdown(keepDir bool) {
	al.mu.Lock()
	al.closed = true
	sessions := make([]*session, 0, len(al.sessions))
	for s := range al.sessions {
		sessions = append(sessions, s)
	}
	for c := range al.refusing {
		_ = c.Close() // its refuse returns
	}
	al.mu.Unlock()
	_ = al.ln.Close()
	<-al.done
	for _, s := range sessions {
		s.close()
	}
	al.closeBridges()
	if keepDir {
		_ = os.Remove(filepath.Join(al.dir, admin.SocketName))
		return
	}
	_ = os.RemoveAll(al.dir)
}

func (al *allocation) drop(s *session) {
	al.mu.Lock()
	delete(al.sessions, s)
	al.mu.Unlock()
}
