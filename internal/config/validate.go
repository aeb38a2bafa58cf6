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
	var errs []error
	add := func(err error) { errs = append(errs, err) }

	if c.APIVersion != APIVersion {
		add(fieldErr("apiVersion", "must be %q, got %q", APIVersion, c.APIVersion))
	}
	if c.Kind != Kind {
		add(fieldErr("kind", "must be %q, got %q", Kind, c.Kind))
	}
	if c.NodeName != "" && (len(c.NodeName) > 253 || !dnsSubdomain.MatchString(c.NodeName)) {
		add(fieldErr("nodeName", "must be a DNS subdomain (a Kubernetes node name), got %q", c.NodeName))
	}
	if c.ServiceName != "" && (len(c.ServiceName) > 40 || !dnsSubdomain.MatchString(c.ServiceName)) {
		add(fieldErr("serviceName", "must be an RDMAService name (DNS subdomain, at most 40 characters), got %q", c.ServiceName))
	}

	switch c.Device.Provider {
	case ProviderIBVerbs:
	case ProviderSoft:
		if len(c.Device.Names) > 0 || len(c.Device.Vendors) > 0 {
			add(fieldErr("device", "names and vendors select hardware devices: they cannot be set with provider soft"))
		}
	default:
		add(fieldErr("device.provider", "must be soft or ibverbs, got %q", c.Device.Provider))
	}
	if c.Device.Port < 0 || c.Device.Port > 255 {
		add(fieldErr("device.port", "must be a port number between 1 and 255, or 0 for port 1, got %d", c.Device.Port))
	}
	if g := c.Device.GIDIndex; g != nil && (*g < 0 || *g > 65535) {
		add(fieldErr("device.gidIndex", "must be between 0 and 65535, got %d", *g))
	}
	if c.Device.Provider == ProviderSoft && (c.Device.Port != 0 || c.Device.GIDIndex != nil) {
		add(fieldErr("device", "port and gidIndex address a hardware device's GID table: they cannot be set with provider soft"))
	}
	for i, n := range c.Device.Names {
		if !deviceWord.MatchString(n) {
			add(fieldErr(fmt.Sprintf("device.names[%d]", i), "invalid device name %q", n))
		}
	}
	for i, v := range c.Device.Vendors {
		if !deviceWord.MatchString(v) {
			add(fieldErr(fmt.Sprintf("device.vendors[%d]", i), "invalid vendor %q", v))
		}
	}

	if c.Soft.Wire != WireUDP {
		add(fieldErr("soft.wire", "must be udp, got %q", c.Soft.Wire))
	}
	if c.Soft.UDPPort < 1 || c.Soft.UDPPort > 65535 {
		add(fieldErr("soft.udpPort", "must be a port between 1 and 65535, got %d", c.Soft.UDPPort))
	}
	if c.Soft.BindAddress != "" {
		if _, err := netip.ParseAddr(c.Soft.BindAddress); err != nil {
			add(fieldErr("soft.bindAddress", "must be an IP address, got %q", c.Soft.BindAddress))
		}
	}

	switch c.Transport {
	case TransportRC, TransportUC, TransportUD, TransportAuto:
	default:
		add(fieldErr("transport", "must be one of rc, uc, ud, auto, got %q", c.Transport))
	}
	if c.QPsPerPeer < 1 || c.QPsPerPeer > MaxQPsPerPeer {
		add(fieldErr("qpsPerPeer", "must be between 1 and %d, got %d", MaxQPsPerPeer, c.QPsPerPeer))
	}
	if c.Pollers < 0 || c.Pollers > MaxPollers {
		add(fieldErr("pollers", "must be between 1 and %d, or 0 for one per CPU, got %d", MaxPollers, c.Pollers))
	}
	if c.BufferPoolBytes < MinBufferPoolBytes || c.BufferPoolBytes > MaxBufferPoolBytes {
		add(fieldErr("bufferPoolBytes", "must be between %d (1Mi) and %d (64Gi), got %d",
			int64(MinBufferPoolBytes), int64(MaxBufferPoolBytes), c.BufferPoolBytes))
	}
	if c.VConnsPerNode < 1 || c.VConnsPerNode > MaxVConnsPerNode {
		add(fieldErr("vconnsPerNode", "must be between 1 and %d, got %d", MaxVConnsPerNode, c.VConnsPerNode))
	}
	switch {
	case c.MaxMessageBytes < 1 || c.MaxMessageBytes > MaxMaxMessageBytes:
		add(fieldErr("maxMessageBytes", "must be between 1 and %d (1Gi), got %d", int64(MaxMaxMessageBytes), c.MaxMessageBytes))
	case c.MaxMessageBytes > c.BufferPoolBytes:
		// A message is staged in registered buffers: it must fit the pool.
		add(fieldErr("maxMessageBytes", "must not exceed bufferPoolBytes (%d), got %d", c.BufferPoolBytes, c.MaxMessageBytes))
	}
	if len(c.ResourceName) > 253 || !resourceName.MatchString(c.ResourceName) {
		add(fieldErr("resourceName", "must be a domain-prefixed name such as %s, got %q", DefaultResourceName, c.ResourceName))
	}

	if c.SocketUID < 0 || c.SocketUID > math.MaxUint32-1 {
		add(fieldErr("socketUID", "must be a user id, 0..%d, got %d", uint32(math.MaxUint32-1), c.SocketUID))
	}
	if c.SocketGID < 0 || c.SocketGID > math.MaxUint32-1 {
		add(fieldErr("socketGID", "must be a group id, 0..%d, got %d", uint32(math.MaxUint32-1), c.SocketGID))
	}
	if !filepath.IsAbs(c.SocketDir) {
		add(fieldErr("socketDir", "must be an absolute path, got %q", c.SocketDir))
	}
	if !filepath.IsAbs(c.StateDir) {
		add(fieldErr("stateDir", "must be an absolute path, got %q", c.StateDir))
	}
	switch {
	case !filepath.IsAbs(c.AdminSocket):
		add(fieldErr("adminSocket", "must be an absolute path, got %q", c.AdminSocket))
	case len(c.AdminSocket) > 107:
		// sun_path holds 108 bytes including the terminating NUL.
		add(fieldErr("adminSocket", "must be at most 107 bytes (a unix socket path), got %d", len(c.AdminSocket)))
	}
	if c.ControlPort < 1 || c.ControlPort > 65535 {
		add(fieldErr("controlPort", "must be a port between 1 and 65535, got %d", c.ControlPort))
	}
	if err := validHostPort(c.MetricsAddress); err != nil {
		add(fieldErr("metricsAddress", "%v", err))
	} else if _, port, _ := net.SplitHostPort(c.MetricsAddress); port == strconv.Itoa(c.ControlPort) {
		add(fieldErr("metricsAddress", "port %s is already the controlPort", port))
	}

	for _, l := range []struct {
		name           string
		v, least, most int64
	}{
		{"sessions", int64(c.Limits.Sessions), 1, MaxSessions},
		{"listeners", int64(c.Limits.Listeners), 1, MaxListeners},
		{"regions", int64(c.Limits.Regions), 1, MaxRegions},
		{"regionBytes", c.Limits.RegionBytes, 1, MaxRegionBytes},
		{"queuedBytes", c.Limits.QueuedBytes, MinQueuedBytes, MaxQueuedBytes},
		{"registeredBytes", c.Limits.RegisteredBytes, 1, MaxRegisteredBytes},
	} {
		if l.v < l.least || l.v > l.most {
			add(fieldErr("limits."+l.name, "must be between %d and %d, got %d", l.least, l.most, l.v))
		}
	}

	if t := c.TLS; t.Enabled() {
		for _, f := range []struct{ name, path string }{{"certFile", t.CertFile}, {"keyFile", t.KeyFile}, {"caFile", t.CAFile}} {
			if !filepath.IsAbs(f.path) {
				add(fieldErr("tls."+f.name, "must be an absolute path (certFile, keyFile and caFile go together), got %q", f.path))
			}
		}
	}

	switch c.PeerDiscovery.Mode {
	case DiscoveryKubernetes:
		if len(c.PeerDiscovery.Static) > 0 {
			add(fieldErr("peerDiscovery.static", "must be empty unless mode is static"))
		}
	case DiscoveryStatic:
		seen := make(map[string]bool, len(c.PeerDiscovery.Static))
		for i, p := range c.PeerDiscovery.Static {
			f := fmt.Sprintf("peerDiscovery.static[%d]", i)
			if !dnsSubdomain.MatchString(p.NodeName) {
				add(fieldErr(f+".nodeName", "must be a node name, got %q", p.NodeName))
			} else if seen[p.NodeName] {
				add(fieldErr(f+".nodeName", "duplicate peer %q", p.NodeName))
			}
			seen[p.NodeName] = true
			if err := validHostPort(p.Address); err != nil {
				add(fieldErr(f+".address", "%v", err))
			}
		}
	default:
		add(fieldErr("peerDiscovery.mode", "must be kubernetes or static, got %q", c.PeerDiscovery.Mode))
	}
	return errors.Join(errs...)
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
