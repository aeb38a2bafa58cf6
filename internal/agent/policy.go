package agent

import (
	"errors"
	"fmt"
	"net/netip"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/netpol"
)

// Policy decides whether the cluster's NetworkPolicies let a vconn dial
// pass, as a CNI plugin enforcing them does for IP: in Kubernetes mode,
// package rdmanode's Policies (package netpol's semantics); nil
// (standalone mode) lets every dial pass. It is asked once a dial, never
// a message: a policy that changes closes nothing already open.
type Policy interface {
	// Ingress is nil when pod to (Endpoint.Pod) may be dialled from from
	// on port; else an error that names the policies refusing it.
	Ingress(from, to netpol.Endpoint, port uint32) error
	// Egress is nil when pod from may dial to on port; else an error
	// that names the policies refusing it.
	Egress(from, to netpol.Endpoint, port uint32) error
}

// errPolicy is a dial a NetworkPolicy refuses, on either node: the
// application sees it as refused (CodeRefused), with the policies named.
var errPolicy = errors.New("refused by NetworkPolicy")

// policyReason marks a control-plane Dial's PermissionDenied that a
// NetworkPolicy caused (an ErrorInfo detail), from the others
// (authorization, a forged caller's IP), which are no refusal of the
// application's.
const policyReason = "NETWORK_POLICY"

// checkIngress asks the policy whether a Dial from the calling node c
// (its pod fromIP; none for its host services) may reach listener l's pod
// at ip: nil, or a PermissionDenied status that says why. A listener of
// the node's host services is no pod's: no policy governs it.
func (a *Agent) checkIngress(c *controlpb.Node, fromIP []byte, ip []byte, l *listener) error {
	if a.opts.Policy == nil || l.key.scope == "" {
		return nil
	}
	l.sess.al.mu.Lock()
	pod := l.sess.al.pod
	l.sess.al.mu.Unlock()
	to := netpol.Endpoint{Pod: pod, Node: a.cfg.NodeName}
	if t, ok := netip.AddrFromSlice(ip); ok {
		to.IP = t.Unmap()
	}
	from := netpol.Endpoint{Node: c.GetName()}
	if f, ok := netip.AddrFromSlice(fromIP); ok {
		from.IP = f.Unmap()
	} else if ap, err := netip.ParseAddrPort(c.GetControlAddress()); err == nil {
		from.IP = ap.Addr().Unmap() // a host service dials from its node's address
	}
	err := a.opts.Policy.Ingress(from, to, l.key.port)
	if err == nil {
		return nil
	}
	st, derr := status.New(codes.PermissionDenied, fmt.Sprintf("%v: %v", errPolicy, err)).
		WithDetails(&errdetails.ErrorInfo{Reason: policyReason, Domain: "rdmavisor.io"})
	if derr != nil {
		return status.Errorf(codes.PermissionDenied, "%v: %v", errPolicy, err)
	}
	return st.Err()
}

// checkEgress asks the policy whether allocation al's pod, at from, may
// dial t's port: nil, or an errPolicy that says why. An allocation of the
// node's host services is no pod's: no policy governs it.
func (a *Agent) checkEgress(al *allocation, from netip.Addr, t target, port uint32) error {
	if a.opts.Policy == nil || !al.podScoped {
		return nil
	}
	al.mu.Lock()
	pod := al.pod
	al.mu.Unlock()
	to := netpol.Endpoint{IP: t.ip, Node: t.peer.NodeName}
	if !t.ip.IsValid() {
		if ap, err := netip.ParseAddrPort(t.peer.Address); err == nil {
			to.IP = ap.Addr().Unmap() // a node's host services, at its address
		}
	}
	if err := a.opts.Policy.Egress(netpol.Endpoint{Pod: pod, IP: from, Node: a.cfg.NodeName}, to, port); err != nil {
		return fmt.Errorf("%w: %w", errPolicy, err)
	}
	return nil
}

// policyDenied reports whether st is a NetworkPolicy's refusal
// (checkIngress).
func policyDenied(st *status.Status) bool {
	if st.Code() != codes.PermissionDenied {
		return false
	}
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetReason() == policyReason {
			return true
		}
	}
	return false
}
