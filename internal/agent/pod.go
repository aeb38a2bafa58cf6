package agent

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"syscall"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/atomicfile"
)

var podUID = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$`)

// RegisterPod records a pod (the CNI plugin's ADD).
func (a *Agent) RegisterPod(p admin.Pod) error {
	if !podUID.MatchString(p.UID) || p.Namespace == "" || p.Name == "" {
		return fmt.Errorf("agent: register pod: uid, namespace and name are required (uid %q)", p.UID)
	}
	for _, ip := range p.IPs {
		if net.ParseIP(ip) == nil {
			return fmt.Errorf("agent: register pod %s: bad IP %q", p.UID, ip)
		}
	}
	a.mu.Lock()
	a.pods[p.UID] = p
	a.podsVer++
	a.podSeq[p.UID] = a.podsVer
	err := a.savePodsLocked()
	a.mu.Unlock()
	a.announceSoon()
	if err != nil {
		a.log.Error(err, "Cannot save the pods: an agent restart will not know them", "file", a.podsFile())
	}
	a.log.Info("Registered pod", "pod", p.Namespace+"/"+p.Name, "uid", p.UID, "ips", p.IPs)
	a.tellPod(p)
	return nil
}

// UnregisterPod forgets a pod (the CNI plugin's DEL) and closes every
// application connection from the pod's network namespace, and so the
// vconns opened through them. Its allocations stay: they are the device
// plugin's, released when the kubelet no longer lists the pod (a DEL can
// precede a sandbox restart of a pod that keeps its devices). Unknown pods
// are not an error: DEL must be idempotent.
func (a *Agent) UnregisterPod(uid string) {
	a.mu.Lock()
	p, ok := a.pods[uid]
	delete(a.pods, uid)
	delete(a.podSeq, uid)
	if ok {
		a.podsVer++
		if err := a.savePodsLocked(); err != nil {
			a.log.Error(err, "Cannot save the pods: an agent restart will not know them", "file", a.podsFile())
		}
	}
	var victims []*session
	if ino, err := netnsInode(p.Netns); ok && p.Netns != "" && err == nil {
		for _, al := range a.allocs {
			al.mu.Lock()
			for s := range al.sessions {
				if s.netns == ino {
					victims = append(victims, s)
				}
			}
			al.mu.Unlock()
		}
	}
	a.mu.Unlock()
	for _, s := range victims {
		s.close()
	}
	if ok {
		a.announceSoon()
	}
	if ok {
		a.log.Info("Unregistered pod", "pod", p.Namespace+"/"+p.Name, "uid", uid, "connectionsClosed", len(victims))
	}
}

// netnsInode identifies a network namespace by its inode (a namespace
// file: /proc/PID/ns/net, or a bind mount of it such as /var/run/netns/X).
func netnsInode(path string) (uint64, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, fmt.Errorf("agent: %s: no inode", path)
	}
	return st.Ino, nil
}

// Pods lists the registered pods.
func (a *Agent) Pods() []admin.Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]admin.Pod, 0, len(a.pods))
	for _, p := range a.pods {
		out = append(out, p)
	}
	return out
}

// podsFile keeps the registered pods across agent restarts: a pod's IPs
// come only with its CNI ADD, and its allocation listens only as the pod.
// It is in the socket directory, which outlives the agent's container as
// the allocations' directories do, and not a reboot, after which the
// pods' sandboxes are made again.
func (a *Agent) podsFile() string { return filepath.Join(a.cfg.SocketDir, "pods.json") }

// savePodsLocked writes the registered pods (a.mu held), atomically.
func (a *Agent) savePodsLocked() error {
	// In the order they registered, which loadPods keeps: of two pods
	// with one IP, the later has it (podOfIPLocked).
	uids := make([]string, 0, len(a.pods))
	for uid := range a.pods {
		uids = append(uids, uid)
	}
	slices.SortFunc(uids, func(x, y string) int { return cmp.Compare(a.podSeq[x], a.podSeq[y]) })
	pods := make([]admin.Pod, 0, len(uids))
	for _, uid := range uids {
		pods = append(pods, a.pods[uid])
	}
	b, err := json.Marshal(pods)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(a.cfg.SocketDir, 0o755); err != nil {
		return err
	}
	return atomicfile.Write(a.podsFile(), b, 0o600)
}

// loadPods reads the pods a previous run of the agent saved; a missing
// file is no pods, a damaged one is logged and ignored.
func (a *Agent) loadPods() {
	b, err := os.ReadFile(a.podsFile())
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var pods []admin.Pod
	if err == nil {
		err = json.Unmarshal(b, &pods)
	}
	if err != nil {
		a.log.Error(err, "Cannot read the pods a previous run saved; the CNI plugin registers them again only with new sandboxes", "file", a.podsFile())
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, p := range pods {
		if podUID.MatchString(p.UID) && p.Namespace != "" && p.Name != "" {
			a.pods[p.UID] = p
			a.podsVer++
			a.podSeq[p.UID] = a.podsVer
		}
	}
	a.log.Info("Loaded the pods a previous run registered", "pods", len(a.pods))
}
