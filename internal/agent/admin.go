package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"syscall"
)

// AdminVersion is the admin protocol version.
const AdminVersion = 1

// maxAdminMessage bounds an admin request or reply.
const maxAdminMessage = 64 << 10

// Admin operations.
const (
	AdminStatus           = "status"
	AdminCreateAllocation = "createAllocation"
	AdminDeleteAllocation = "deleteAllocation"
	AdminListAllocations  = "listAllocations"
	AdminRegisterPod      = "registerPod"
	AdminUnregisterPod    = "unregisterPod"
	AdminListPods         = "listPods"
)

// AdminRequest is one admin request: one JSON document per datagram.
type AdminRequest struct {
	Version    int         `json:"version"`
	Op         string      `json:"op"`
	Allocation *Allocation `json:"allocation,omitempty"` // create
	ID         string      `json:"id,omitempty"`         // delete allocation, unregister pod (UID)
	Pod        *Pod        `json:"pod,omitempty"`        // register
}

// AdminReply answers an AdminRequest.
type AdminReply struct {
	Version     int          `json:"version"`
	Error       string       `json:"error,omitempty"`
	Code        string       `json:"code,omitempty"` // "invalid", "exists", "notFound", "quota", "internal"
	Allocation  *Allocation  `json:"allocation,omitempty"`
	Allocations []Allocation `json:"allocations,omitempty"`
	Pods        []Pod        `json:"pods,omitempty"`
	Status      *Status      `json:"status,omitempty"`
}

// Allocation is a share of the node's vconns with its own socket.
type Allocation struct {
	ID     string `json:"id"`
	VConns int    `json:"vconns"`
	Socket string `json:"socket,omitempty"` // set by the agent
	InUse  int    `json:"inUse,omitempty"`  // set by the agent
}

// Pod is a pod the CNI plugin registered.
type Pod struct {
	UID         string   `json:"uid"`
	Namespace   string   `json:"namespace"`
	Name        string   `json:"name"`
	IPs         []string `json:"ips,omitempty"`
	Netns       string   `json:"netns,omitempty"`
	ContainerID string   `json:"containerID,omitempty"`
}

// Status is the agent's state.
type Status struct {
	Ready     bool   `json:"ready"`
	Node      string `json:"node"`
	Capacity  int    `json:"capacity"`  // vconns per node
	Allocated int    `json:"allocated"` // sum of the allocations' quotas
	VConns    int    `json:"vconns"`    // open in the engine
	QPs       int    `json:"qps"`
	Peers     int    `json:"peers"`
	// Device, GID and Control say where peers reach this agent.
	Device  string `json:"device,omitempty"`
	GID     string `json:"gid,omitempty"`
	Control string `json:"control,omitempty"`
}

// Status reports the agent's state.
func (a *Agent) Status() Status {
	st := a.eng.Stats()
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Status{Ready: a.ready.Load(), Node: a.cfg.NodeName, Capacity: a.cfg.VConnsPerNode, VConns: st.VConns, QPs: st.QPs, Peers: st.Peers,
		Device: a.dev.Attr().Name, GID: a.eng.GID().String(), Control: a.ctlAddr}
	for _, al := range a.allocs {
		s.Allocated += al.quota
	}
	return s
}

var podUID = regexp.MustCompile(`^[A-Za-z0-9][-A-Za-z0-9_.]{0,127}$`)

// RegisterPod records a pod (the CNI plugin's ADD).
func (a *Agent) RegisterPod(p Pod) error {
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
	a.mu.Unlock()
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
func (a *Agent) Pods() []Pod {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Pod, 0, len(a.pods))
	for _, p := range a.pods {
		out = append(out, p)
	}
	return out
}

func (a *Agent) serveAdmin() error {
	path := a.cfg.AdminSocket
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("agent: admin socket: %w", err)
	}
	_ = os.Remove(path)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return fmt.Errorf("agent: admin socket: %w", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		_ = ln.Close()
		return fmt.Errorf("agent: admin socket: %w", err)
	}
	a.adminLn = ln
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			a.wg.Add(1)
			go func() {
				defer a.wg.Done()
				a.serveAdminConn(c)
			}()
		}
	}()
	return nil
}

func (a *Agent) serveAdminConn(c *net.UnixConn) {
	defer c.Close()
	stop := context.AfterFunc(a.ctx, func() { _ = c.Close() })
	defer stop()
	log := a.log.WithName("admin")
	cred, err := peerCred(c)
	if err != nil {
		log.Error(err, "Refusing an admin client whose credentials are unknown")
		return
	}
	log = log.WithValues("pid", cred.Pid, "uid", cred.Uid)
	// The socket is 0600; the check also holds if the directory is ever
	// shared: only root and the agent's own user administer it.
	if cred.Uid != 0 && int(cred.Uid) != os.Getuid() {
		log.Info("Refusing an admin client: not root nor the agent's user")
		return
	}
	log.V(1).Info("Admin client connected")
	buf := make([]byte, maxAdminMessage+1)
	for {
		n, err := c.Read(buf)
		if err != nil || n == 0 {
			return
		}
		rep := a.admin(buf[:n])
		rep.Version = AdminVersion
		out, err := json.Marshal(rep)
		if err != nil {
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
		if rep.Code == "malformed" {
			return
		}
	}
}

func adminErr(code string, err error) AdminReply {
	return AdminReply{Code: code, Error: err.Error()}
}

// DecodeAdminRequest parses one admin request strictly: unknown fields and
// trailing data are errors.
func DecodeAdminRequest(b []byte) (AdminRequest, error) {
	var req AdminRequest
	if len(b) > maxAdminMessage {
		return req, errors.New("request larger than 64 KiB")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		return req, fmt.Errorf("decoding request: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return req, errors.New("trailing data after the request")
	}
	return req, nil
}

// admin serves one request.
func (a *Agent) admin(b []byte) AdminReply {
	if len(b) > maxAdminMessage {
		return adminErr("malformed", errors.New("request larger than 64 KiB"))
	}
	req, err := DecodeAdminRequest(b)
	if err != nil {
		return adminErr("malformed", err)
	}
	if req.Version != AdminVersion {
		return adminErr("version", fmt.Errorf("admin protocol version %d not supported: this agent speaks %d", req.Version, AdminVersion))
	}
	classify := func(err error) AdminReply {
		switch {
		case errors.Is(err, ErrExists):
			return adminErr("exists", err)
		case errors.Is(err, ErrNotFound):
			return adminErr("notFound", err)
		case errors.Is(err, ErrQuota):
			return adminErr("quota", err)
		}
		return adminErr("invalid", err)
	}
	switch req.Op {
	case AdminStatus:
		st := a.Status()
		return AdminReply{Status: &st}
	case AdminCreateAllocation:
		if req.Allocation == nil {
			return adminErr("invalid", errors.New("createAllocation: allocation is required"))
		}
		al, err := a.CreateAllocation(req.Allocation.ID, req.Allocation.VConns)
		if err != nil {
			return classify(err)
		}
		return AdminReply{Allocation: &al}
	case AdminDeleteAllocation:
		if err := a.DeleteAllocation(req.ID); err != nil {
			return classify(err)
		}
		return AdminReply{}
	case AdminListAllocations:
		return AdminReply{Allocations: a.Allocations()}
	case AdminRegisterPod:
		if req.Pod == nil {
			return adminErr("invalid", errors.New("registerPod: pod is required"))
		}
		if err := a.RegisterPod(*req.Pod); err != nil {
			return classify(err)
		}
		return AdminReply{}
	case AdminUnregisterPod:
		a.UnregisterPod(req.ID)
		return AdminReply{}
	case AdminListPods:
		return AdminReply{Pods: a.Pods()}
	}
	return adminErr("invalid", fmt.Errorf("unknown op %q", req.Op))
}
