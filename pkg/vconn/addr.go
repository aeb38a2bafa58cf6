package vconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// Resolver resolves host names to IPs; *net.Resolver is one (the default,
// net.DefaultResolver: in a pod, the cluster's DNS).
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Addr is a vconn endpoint address: "podIP:port" for a pod's, or
// "node:port" for a node's host services; a dialer's is "podIP:0" or
// "node:0" (a vconn has no source port).
type Addr string

// Network is "vconn".
func (Addr) Network() string { return "vconn" }

func (a Addr) String() string { return string(a) }

// splitAddr parses "host:port" with a port of 1..65535 as the agent
// does (frame.SplitAddr). The host may be empty (Listen's ":port").
func splitAddr(addr string) (host string, port uint16, err error) { return frame.SplitAddr(addr) }

// Dial connects a vconn to the listener at addr, "host:port", as a TCP
// dial would: host is a pod IP (the port is that pod's), a node's name or
// IP (its host services), or a name the agent does not know as a node's,
// which the client resolves (Options.Resolver; in a pod, a Service's
// name through cluster DNS) and dials IP by IP until one answers. A
// headless Service's name resolves to its pods' IPs; a ClusterIP is no
// pod's, so a vconn server's Service must be headless (clusterIP: None).
func (c *Client) Dial(ctx context.Context, addr string) (*Conn, error) {
	host, port, err := splitAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("vconn: dial: %w", &Error{Code: CodeBadRequest, Message: err.Error()})
	}
	if host == "" {
		return nil, fmt.Errorf("vconn: dial %q: %w", addr, &Error{Code: CodeBadRequest, Message: "no host"})
	}
	vc, err := c.dial(ctx, addr)
	if !errors.Is(err, ErrUnknownHost) {
		return vc, err
	}
	r := c.opts.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	ips, rerr := r.LookupNetIP(ctx, "ip", host)
	if rerr != nil {
		return nil, fmt.Errorf("vconn: dial %s: no node of that name, and resolving it: %w", addr, errors.Join(&Error{Code: CodeUnknownHost, Message: host}, rerr))
	}
	var errs []error
	for _, ip := range ips {
		vc, err := c.dial(ctx, netip.AddrPortFrom(ip.Unmap(), port).String())
		if err == nil {
			return vc, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("vconn: dial %s: %w", addr, &Error{Code: CodeUnknownHost, Message: host + " resolves to no IP"})
	}
	return nil, fmt.Errorf("vconn: dial %s (%d IPs): %w", addr, len(ips), errors.Join(errs...))
}

// Listen accepts vconns dialled to a port of the allocation's own port
// space: its pod's (the listener's address is "podIP:port"), or the
// node's host services' for an allocation made for no pod ("node:port").
// addr is ":port"; a host, if given, must be one the listener gets
// (the pod's IP, the node's name, or an unspecified IP).
func (c *Client) Listen(ctx context.Context, addr string) (*Listener, error) {
	host, port, err := splitAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("vconn: listen: %w", &Error{Code: CodeBadRequest, Message: err.Error()})
	}
	l, err := c.listen(ctx, addr, port)
	if err != nil {
		return nil, err
	}
	if ip, perr := netip.ParseAddr(host); host == "" || perr == nil && ip.IsUnspecified() {
		return l, nil
	}
	if bound, _, _ := net.SplitHostPort(string(l.addr)); bound != host {
		_ = l.Close()
		return nil, fmt.Errorf("vconn: listen %s: %w", addr, &Error{Code: CodeBadRequest,
			Message: fmt.Sprintf("this allocation listens at %s, not at %s", l.addr, host)})
	}
	return l, nil
}
