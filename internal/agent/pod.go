package agent

import (
	"fmt"
	"net"
	"os"
	"regexp"
	"syscall"

	"github.com/rdmavisor/rdmavisor/internal/admin"
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
	a.mu.Unlock()
	a.announceSoon()
	a.log.Info("Registered pod", "pod", p.Namespace+"/"+p.Name, "uid", p.UID, "ips", p.IPs)
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
