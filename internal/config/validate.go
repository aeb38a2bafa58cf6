package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/rdmavisor/rdmavisor/internal/transport"
)

// FieldError is a problem with one field, named by its path in the document.
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

var (
	// dnsSubdomain is RFC 1123, as Kubernetes names nodes.
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	// resourceName is a domain-prefixed extended resource name.
	resourceName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	// deviceWord is a device name or vendor.
	deviceWord = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
)

// Validate reports every invalid field, joined with errors.Join; each error is
// a *FieldError naming the field.
func (c *AgentConfig) Validate() error {
	var p problems
	c.checkIdentity(&p)
	c.Device.check(&p)
	c.Soft.check(&p)
	c.checkDataPlane(&p)
	c.checkFiles(&p)
	c.checkAddresses(&p)
	c.Limits.check(&p)
	c.TLS.check(&p)
	c.PeerDiscovery.check(&p)
	return errors.Join(p...)
}

// problems collects a document's field errors, in the order found.
type problems []error

func (p *problems) add(field, format string, args ...any) {
	*p = append(*p, fieldErr(field, format, args...))
}

func (c *AgentConfig) checkIdentity(p *problems) {
	if c.APIVersion != APIVersion {
		p.add("apiVersion", "must be %q, got %q", APIVersion, c.APIVersion)
	}
	if c.Kind != Kind {
		p.add("kind", "must be %q, got %q", Kind, c.Kind)
	}
	if c.NodeName != "" && (len(c.NodeName) > 253 || !dnsSubdomain.MatchString(c.NodeName)) {
		p.add("nodeName", "must be a DNS subdomain (a Kubernetes node name), got %q", c.NodeName)
	}
	if c.ServiceName != "" && (len(c.ServiceName) > 40 || !dnsSubdomain.MatchString(c.ServiceName)) {
		p.add("serviceName", "must be an RDMAService name (DNS subdomain, at most 40 characters), got %q", c.ServiceName)
	}
}

func (d *DeviceConfig) check(p *problems) {
	switch d.Provider {
	case ProviderIBVerbs:
	case ProviderSoft:
		if len(d.Names) > 0 || len(d.Vendors) > 0 {
			p.add("device", "names and vendors select hardware devices: they cannot be set with provider soft")
		}
	default:
		p.add("device.provider", "must be soft or ibverbs, got %q", d.Provider)
	}
	if d.Port < 0 || d.Port > 255 {
		p.add("device.port", "must be a port number between 1 and 255, or 0 for port 1, got %d", d.Port)
	}
	if g := d.GIDIndex; g != nil && (*g < 0 || *g > 65535) {
		p.add("device.gidIndex", "must be between 0 and 65535, got %d", *g)
	}
	if d.Provider == ProviderSoft && (d.Port != 0 || d.GIDIndex != nil) {
		p.add("device", "port and gidIndex address a hardware device's GID table: they cannot be set with provider soft")
	}
	if d.Rails < 0 || d.Rails > MaxRails {
		p.add("device.rails", "must be between 1 and %d, or 0 for one, got %d", MaxRails, d.Rails)
	} else if d.Provider == ProviderIBVerbs && d.Rails > 1 && len(d.Names) < d.Rails {
		p.add("device.rails", "%d rails of provider ibverbs need as many device.names, one a rail, got %d", d.Rails, len(d.Names))
	}
	for i, n := range d.Names {
		if !deviceWord.MatchString(n) {
			p.add(fmt.Sprintf("device.names[%d]", i), "invalid device name %q", n)
		}
	}
	for i, v := range d.Vendors {
		if !deviceWord.MatchString(v) {
			p.add(fmt.Sprintf("device.vendors[%d]", i), "invalid vendor %q", v)
		}
	}
}

func (s *SoftConfig) check(p *problems) {
	if s.Wire != WireUDP {
		p.add("soft.wire", "must be udp, got %q", s.Wire)
	}
	if s.UDPPort < 1 || s.UDPPort > 65535 {
		p.add("soft.udpPort", "must be a port between 1 and 65535, got %d", s.UDPPort)
	}
	if s.BindAddress != "" {
		if _, err := netip.ParseAddr(s.BindAddress); err != nil {
			p.add("soft.bindAddress", "must be an IP address, got %q", s.BindAddress)
		}
	}
	for i, a := range s.RailAddresses {
		if _, err := netip.ParseAddr(a); err != nil {
			p.add(fmt.Sprintf("soft.railAddresses[%d]", i), "must be an IP address, got %q", a)
		}
	}
}

// checkDataPlane checks what sizes the engine and the device plugin.
func (c *AgentConfig) checkDataPlane(p *problems) {
	if _, err := c.Transport.Kind(); err != nil {
		p.add("transport", "must be one of %s, got %q", strings.Join(transport.Names(), ", "), c.Transport)
	}
	if c.QPsPerPeer < 1 || c.QPsPerPeer > MaxQPsPerPeer {
		p.add("qpsPerPeer", "must be between 1 and %d, got %d", MaxQPsPerPeer, c.QPsPerPeer)
	}
	if c.Pollers < 0 || c.Pollers > MaxPollers {
		p.add("pollers", "must be between 1 and %d, or 0 for one per CPU, got %d", MaxPollers, c.Pollers)
	}
	if c.BufferPoolBytes < MinBufferPoolBytes || c.BufferPoolBytes > MaxBufferPoolBytes {
		p.add("bufferPoolBytes", "must be between %d (1Mi) and %d (64Gi), got %d",
			int64(MinBufferPoolBytes), int64(MaxBufferPoolBytes), c.BufferPoolBytes)
	}
	if c.VConnsPerNode < 1 || c.VConnsPerNode > MaxVConnsPerNode {
		p.add("vconnsPerNode", "must be between 1 and %d, got %d", MaxVConnsPerNode, c.VConnsPerNode)
	}
	switch {
	case c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMaxMessageBytes:
		p.add("maxMessageBytes", "must be between 1 and %d (1Gi), got %d", int64(MaxMaxMessageBytes), c.MaxMessageBytes)
	case c.MaxMessageBytes > c.BufferPoolBytes:
		// A message is staged in registered buffers: it must fit the pool.
		p.add("maxMessageBytes", "must not exceed bufferPoolBytes (%d), got %d", c.BufferPoolBytes, c.MaxMessageBytes)
	}
	if len(c.ResourceName) > 253 || !resourceName.MatchString(c.ResourceName) {
		p.add("resourceName", "must be a domain-prefixed name such as %s, got %q", DefaultResourceName, c.ResourceName)
	}
}

// checkFiles checks the sockets' owners and the paths on the node.
func (c *AgentConfig) checkFiles(p *problems) {
	if c.SocketUID < 0 || c.SocketUID > math.MaxUint32-1 {
		p.add("socketUID", "must be a user id, 0..%d, got %d", uint32(math.MaxUint32-1), c.SocketUID)
	}
	if c.SocketGID < 0 || c.SocketGID > math.MaxUint32-1 {
		p.add("socketGID", "must be a group id, 0..%d, got %d", uint32(math.MaxUint32-1), c.SocketGID)
	}
	if !filepath.IsAbs(c.SocketDir) {
		p.add("socketDir", "must be an absolute path, got %q", c.SocketDir)
	}
	if !filepath.IsAbs(c.StateDir) {
		p.add("stateDir", "must be an absolute path, got %q", c.StateDir)
	}
	switch {
	case !filepath.IsAbs(c.AdminSocket):
		p.add("adminSocket", "must be an absolute path, got %q", c.AdminSocket)
	case len(c.AdminSocket) > 107:
		// sun_path holds 108 bytes including the terminating NUL.
		p.add("adminSocket", "must be at most 107 bytes (a unix socket path), got %d", len(c.AdminSocket))
	}
}

// checkAddresses checks the ports the agent listens on.
func (c *AgentConfig) checkAddresses(p *problems) {
	if c.ControlPort < 1 || c.ControlPort > 65535 {
		p.add("controlPort", "must be a port between 1 and 65535, got %d", c.ControlPort)
	}
	if err := validHostPort(c.MetricsAddress); err != nil {
		p.add("metricsAddress", "%v", err)
	} else if _, port, _ := net.SplitHostPort(c.MetricsAddress); port == strconv.Itoa(c.ControlPort) {
		p.add("metricsAddress", "port %s is already the controlPort", port)
	}
}

func (l *Limits) check(p *problems) {
	for _, f := range []struct {
		name           string
		v, least, most int64
	}{
		{"sessions", int64(l.Sessions), 1, MaxSessions},
		{"listeners", int64(l.Listeners), 1, MaxListeners},
		{"regions", int64(l.Regions), 1, MaxRegions},
		{"regionBytes", l.RegionBytes, 1, MaxRegionBytes},
		{"queuedBytes", l.QueuedBytes, MinQueuedBytes, MaxQueuedBytes},
		{"registeredBytes", l.RegisteredBytes, 1, MaxRegisteredBytes},
	} {
		if f.v < f.least || f.v > f.most {
			p.add("limits."+f.name, "must be between %d and %d, got %d", f.least, f.most, f.v)
		}
	}
	for _, f := range []struct {
		name    string
		v, most int64
	}{
		{"messageRate", int64(l.MessageRate), MaxMessageRate},
		{"byteRate", l.ByteRate, MaxByteRate},
	} {
		if f.v < 0 || f.v > f.most {
			p.add("limits."+f.name, "must be between 1 and %d, or 0 for unlimited, got %d", f.most, f.v)
		}
	}
}

func (t TLSConfig) check(p *problems) {
	if !t.Enabled() {
		return
	}
	for _, f := range []struct{ name, path string }{{"certFile", t.CertFile}, {"keyFile", t.KeyFile}, {"caFile", t.CAFile}} {
		if !filepath.IsAbs(f.path) {
			p.add("tls."+f.name, "must be an absolute path (certFile, keyFile and caFile go together), got %q", f.path)
		}
	}
}

func (d *PeerDiscovery) check(p *problems) {
	switch d.Mode {
	case DiscoveryKubernetes:
		if len(d.Static) > 0 {
			p.add("peerDiscovery.static", "must be empty unless mode is static")
		}
	case DiscoveryStatic:
		seen := make(map[string]bool, len(d.Static))
		for i, peer := range d.Static {
			f := fmt.Sprintf("peerDiscovery.static[%d]", i)
			if !dnsSubdomain.MatchString(peer.NodeName) {
				p.add(f+".nodeName", "must be a node name, got %q", peer.NodeName)
			} else if seen[peer.NodeName] {
				p.add(f+".nodeName", "duplicate peer %q", peer.NodeName)
			}
			seen[peer.NodeName] = true
			if err := validHostPort(peer.Address); err != nil {
				p.add(f+".address", "%v", err)
			}
			if len(peer.RailGIDs) >= MaxRails {
				p.add(f+".railGIDs", "at most %d (rails 1..%d), got %d", MaxRails-1, MaxRails-1, len(peer.RailGIDs))
			}
			for j, g := range peer.RailGIDs {
				if net.ParseIP(g) == nil {
					p.add(fmt.Sprintf("%s.railGIDs[%d]", f, j), "must be an IP address, got %q", g)
				}
			}
		}
	default:
		p.add("peerDiscovery.mode", "must be kubernetes or static, got %q", d.Mode)
	}
}

// validHostPort accepts host:port with a numeric port in 1..65535; the host
// may be empty (all addresses).
func validHostPort(s string) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("must be host:port, got %q", s)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port must be between 1 and 65535, got %q", port)
	}
	return nil
}
