package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// Status reports the agent's state.
//
// VConns and QPs are summed over the rails; Peers is rail 0's (a node is
// a peer on every rail it shares).
func (a *Agent) Status() admin.Status {
	st := a.eng.Stats()
	a.mu.Lock()
	defer a.mu.Unlock()
	s := admin.Status{Ready: a.ready.Load(), Node: a.cfg.NodeName, Capacity: a.cfg.VConnsPerNode, VConns: st.VConns, QPs: st.QPs, Peers: st.Peers,
		Device: a.dev.Attr().Name, GID: a.eng.GID().String(), Control: a.ctlAddr}
	for i, e := range a.engines {
		est, attr := e.Stats(), a.devs[i].Attr()
		s.Rails = append(s.Rails, admin.Rail{Device: attr.Name, GID: e.GID().String(), LinkLayer: attr.LinkLayer.String(), NUMANode: attr.NUMANode,
			VConns: est.VConns, QPs: est.QPs, Peers: est.Peers, Down: a.railDown[i]})
	}
	for _, al := range a.allocs {
		s.Allocated += al.quota
		s.Rails[al.rail].Allocated += al.quota
	}
	for node, r := range a.remotes {
		r.mu.Lock()
		if r.lost {
			s.Unreachable = append(s.Unreachable, node)
		}
		r.mu.Unlock()
	}
	slices.Sort(s.Unreachable)
	for _, r := range s.Rails[1:] {
		s.VConns, s.QPs = s.VConns+r.VConns, s.QPs+r.QPs
	}
	return s
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
	buf := make([]byte, admin.MaxMessage+1)
	for {
		n, err := c.Read(buf)
		if err != nil || n == 0 {
			return
		}
		rep := a.serveAdminRequest(buf[:n])
		rep.Version = admin.Version
		out, err := json.Marshal(rep)
		if err != nil {
			return
		}
		if _, err := c.Write(out); err != nil {
			return
		}
		if rep.Code == admin.CodeMalformed {
			return
		}
	}
}

func adminErr(code string, err error) admin.Reply {
	return admin.Reply{Code: code, Error: err.Error()}
}

// serveAdminRequest serves one request.
func (a *Agent) serveAdminRequest(b []byte) admin.Reply {
	if len(b) > admin.MaxMessage {
		return adminErr(admin.CodeMalformed, errors.New("request larger than 64 KiB"))
	}
	req, err := admin.DecodeRequest(b)
	if err != nil {
		return adminErr(admin.CodeMalformed, err)
	}
	if req.Version != admin.Version {
		return adminErr(admin.CodeVersion, fmt.Errorf("admin protocol version %d not supported: this agent speaks %d", req.Version, admin.Version))
	}
	return a.serveAdminOp(&req)
}

// serveAdminOp performs a well-formed request of this agent's version.
func (a *Agent) serveAdminOp(req *admin.Request) admin.Reply {
	switch req.Op {
	case admin.OpStatus:
		st := a.Status()
		return admin.Reply{Status: &st}
	case admin.OpCreateAllocation:
		if req.Allocation == nil {
			return adminErr(admin.CodeInvalid, errors.New("createAllocation: allocation is required"))
		}
		al, err := a.createAllocation(req.Allocation.ID, req.Allocation.VConns, req.Allocation.PodScoped, req.Allocation.Rail)
		if err != nil {
			return classifyAdminErr(err)
		}
		return admin.Reply{Allocation: &al}
	case admin.OpDeleteAllocation:
		return adminDone(a.DeleteAllocation(req.ID))
	case admin.OpListAllocations:
		return admin.Reply{Allocations: a.Allocations()}
	case admin.OpBindAllocation:
		if req.Pod == nil {
			return adminErr(admin.CodeInvalid, errors.New("bindAllocation: pod is required"))
		}
		return adminDone(a.BindAllocation(req.ID, req.Pod.Namespace, req.Pod.Name))
	case admin.OpRegisterPod:
		if req.Pod == nil {
			return adminErr(admin.CodeInvalid, errors.New("registerPod: pod is required"))
		}
		return adminDone(a.RegisterPod(*req.Pod))
	case admin.OpUnregisterPod:
		a.UnregisterPod(req.ID)
		return admin.Reply{}
	case admin.OpListPods:
		return admin.Reply{Pods: a.Pods()}
	case admin.OpRenewCertificate:
		return a.renewCertificate()
	}
	return adminErr(admin.CodeInvalid, fmt.Errorf("unknown op %q", req.Op))
}

// adminDone is the reply to an operation that returns nothing but err.
func adminDone(err error) admin.Reply {
	if err != nil {
		return classifyAdminErr(err)
	}
	return admin.Reply{}
}

// classifyAdminErr is the reply to an operation that failed with err.
func classifyAdminErr(err error) admin.Reply {
	switch {
	case errors.Is(err, admin.ErrExists):
		return adminErr(admin.CodeExists, err)
	case errors.Is(err, admin.ErrNotFound):
		return adminErr(admin.CodeNotFound, err)
	case errors.Is(err, admin.ErrQuota):
		return adminErr(admin.CodeQuota, err)
	case errors.Is(err, admin.ErrUnavailable):
		return adminErr(admin.CodeUnavailable, err)
	}
	return adminErr(admin.CodeInvalid, err)
}

// renewCertificate requests a new node certificate now.
func (a *Agent) renewCertificate() admin.Reply {
	if a.opts.RenewCertificate == nil {
		return adminErr(admin.CodeInvalid, errors.New("renewCertificate: this agent does not request its certificate (no TLS, or static discovery with provisioned files)"))
	}
	ctx, cancel := context.WithTimeout(a.ctx, 30*time.Second)
	defer cancel()
	cert, err := a.opts.RenewCertificate(ctx)
	if err != nil {
		return adminErr(admin.CodeFailed, fmt.Errorf("renewCertificate: %w", err))
	}
	a.log.Info("Renewed the node certificate on request", "serial", cert.SerialNumber.String(), "notAfter", cert.NotAfter)
	return admin.Reply{Certificate: &admin.Certificate{Serial: cert.SerialNumber.String(), Subject: cert.Subject.String(),
		NotBefore: cert.NotBefore, NotAfter: cert.NotAfter}}
}
