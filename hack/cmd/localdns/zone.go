package main

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

// ttl is short: a headless Service's ready pods change as pods come and go,
// and clients should not keep a gone pod's IP for long.
const ttl = 5

// Zone is the cluster's names at one moment: each Service's FQDN,
// lower-case and dot-terminated ("echo.default.svc.cluster.local."), with
// its addresses. A name with no addresses (a headless Service without
// ready pods) exists, so its queries are NODATA rather than NXDOMAIN.
type Zone struct {
	Domain string // "cluster.local."
	Names  map[string][]netip.Addr
}

// BuildZone computes the zone from Services and EndpointSlices: a
// ClusterIP Service's name resolves to its ClusterIPs, a headless one's to
// its EndpointSlices' ready addresses (all of them with
// publishNotReadyAddresses). ExternalName Services are left out: they
// would need a CNAME to a name outside the cluster, which nothing here can
// resolve.
func BuildZone(domain string, svcs []*corev1.Service, slices []*discoveryv1.EndpointSlice) *Zone {
	domain = canonical(domain)
	z := &Zone{Domain: domain, Names: map[string][]netip.Addr{}}
	headless := map[string]*corev1.Service{} // by "ns/name"
	for _, s := range svcs {
		if s.Spec.Type == corev1.ServiceTypeExternalName {
			continue
		}
		name := canonical(s.Name + "." + s.Namespace + ".svc." + domain)
		if s.Spec.ClusterIP == corev1.ClusterIPNone {
			headless[s.Namespace+"/"+s.Name] = s
			z.Names[name] = nil
			continue
		}
		ips := s.Spec.ClusterIPs
		if len(ips) == 0 && s.Spec.ClusterIP != "" {
			ips = []string{s.Spec.ClusterIP}
		}
		z.Names[name] = appendAddrs(nil, ips)
	}
	for _, es := range slices {
		svc := headless[es.Namespace+"/"+es.Labels[discoveryv1.LabelServiceName]]
		if svc == nil {
			continue
		}
		name := canonical(svc.Name + "." + svc.Namespace + ".svc." + domain)
		for _, ep := range es.Endpoints {
			// A nil Ready means ready: the API's documented default.
			ready := ep.Conditions.Ready == nil || *ep.Conditions.Ready
			if !ready && !svc.Spec.PublishNotReadyAddresses {
				continue
			}
			z.Names[name] = appendAddrs(z.Names[name], ep.Addresses)
		}
	}
	for name, ips := range z.Names {
		z.Names[name] = dedup(ips)
	}
	return z
}

func canonical(name string) string {
	name = strings.ToLower(name)
	if !strings.HasSuffix(name, ".") {
		name += "."
	}
	return name
}

func appendAddrs(dst []netip.Addr, ips []string) []netip.Addr {
	for _, s := range ips {
		if ip, err := netip.ParseAddr(s); err == nil {
			dst = append(dst, ip.Unmap())
		}
	}
	return dst
}

func dedup(ips []netip.Addr) []netip.Addr {
	seen := map[netip.Addr]bool{}
	out := ips[:0]
	for _, ip := range ips {
		if !seen[ip] {
			seen[ip] = true
			out = append(out, ip)
		}
	}
	return out
}

// lookup says what the zone holds for name: its addresses, and whether
// the name exists (a Service's name, or a name above one such as
// "default.svc.cluster.local.", which exists with no records of its own).
func (z *Zone) lookup(name string) ([]netip.Addr, bool) {
	if ips, ok := z.Names[name]; ok {
		return ips, true
	}
	if !strings.HasSuffix(name, z.Domain) {
		return nil, false
	}
	for n := range z.Names {
		if strings.HasSuffix(n, "."+name) {
			return nil, true
		}
	}
	return nil, false
}

// errDrop: the query cannot even be answered with an error (no header).
var errDrop = errors.New("unparseable query")

const (
	minUDPSize = 512
	maxUDPSize = 4096
)

// Answer returns the response to the DNS query msg. udp limits the
// response to what the client takes over UDP (512 bytes, or its EDNS0
// size); a response that does not fit is truncated (TC) so the client
// retries over TCP. Names outside the zone are NXDOMAIN too: there is no
// upstream to ask, and the kubelet's search path makes clients ask for
// such names ("echo.default.svc.default.svc.cluster.local.") before the
// right one.
func (z *Zone) Answer(msg []byte, udp bool) ([]byte, error) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDrop, err)
	}
	if h.Response {
		return nil, fmt.Errorf("%w: a response, not a query", errDrop)
	}
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired}
	if h.OpCode != 0 {
		rh.RCode = dnsmessage.RCodeNotImplemented
		return finish(rh, nil, nil, nil)
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		rh.RCode = dnsmessage.RCodeFormatError
		return finish(rh, nil, nil, nil)
	}
	q := qs[0]
	// The client's EDNS0 UDP size, if it sent an OPT record; echoing an
	// OPT tells it this server speaks EDNS0.
	size, edns := minUDPSize, false
	if err := p.SkipAllAnswers(); err == nil {
		if err := p.SkipAllAuthorities(); err == nil {
			for {
				ah, err := p.AdditionalHeader()
				if err != nil {
					break
				}
				if ah.Type == dnsmessage.TypeOPT {
					edns = true
					size = min(max(int(ah.Class), minUDPSize), maxUDPSize)
				}
				if err := p.SkipAdditional(); err != nil {
					break
				}
			}
		}
	}
	var opt *dnsmessage.Resource
	if edns {
		opt = &dnsmessage.Resource{Body: &dnsmessage.OPTResource{}}
		if err := opt.Header.SetEDNS0(maxUDPSize, dnsmessage.RCodeSuccess, false); err != nil {
			return nil, fmt.Errorf("building OPT: %w", err)
		}
	}
	ips, known := z.lookup(strings.ToLower(q.Name.String()))
	rh.Authoritative = strings.HasSuffix(strings.ToLower(q.Name.String()), z.Domain)
	if !known {
		rh.RCode = dnsmessage.RCodeNameError
		return finish(rh, &q, nil, opt)
	}
	if q.Class != dnsmessage.ClassINET && q.Class != dnsmessage.ClassANY {
		return finish(rh, &q, nil, opt)
	}
	var answers []netip.Addr
	for _, ip := range ips {
		if q.Type == dnsmessage.TypeA && ip.Is4() || q.Type == dnsmessage.TypeAAAA && ip.Is6() {
			answers = append(answers, ip)
		}
	}
	out, err := finish(rh, &q, answers, opt)
	if err == nil && udp && len(out) > size {
		// Too big for UDP: the header and question, TC set.
		rh.Truncated = true
		return finish(rh, &q, nil, opt)
	}
	return out, err
}

func finish(h dnsmessage.Header, q *dnsmessage.Question, ips []netip.Addr, opt *dnsmessage.Resource) ([]byte, error) {
	b := dnsmessage.NewBuilder(make([]byte, 0, 512), h)
	b.EnableCompression()
	if err := b.StartQuestions(); err != nil {
		return nil, fmt.Errorf("building response: %w", err)
	}
	if q != nil {
		if err := b.Question(*q); err != nil {
			return nil, fmt.Errorf("building response: %w", err)
		}
	}
	if err := b.StartAnswers(); err != nil {
		return nil, fmt.Errorf("building response: %w", err)
	}
	for _, ip := range ips {
		rh := dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: ttl}
		var err error
		if ip.Is4() {
			rh.Type = dnsmessage.TypeA
			err = b.AResource(rh, dnsmessage.AResource{A: ip.As4()})
		} else {
			rh.Type = dnsmessage.TypeAAAA
			err = b.AAAAResource(rh, dnsmessage.AAAAResource{AAAA: ip.As16()})
		}
		if err != nil {
			return nil, fmt.Errorf("building response: %w", err)
		}
	}
	if opt != nil {
		if err := b.StartAdditionals(); err != nil {
			return nil, fmt.Errorf("building response: %w", err)
		}
		if err := b.OPTResource(opt.Header, *opt.Body.(*dnsmessage.OPTResource)); err != nil {
			return nil, fmt.Errorf("building response: %w", err)
		}
	}
	out, err := b.Finish()
	if err != nil {
		return nil, fmt.Errorf("building response: %w", err)
	}
	return out, nil
}
