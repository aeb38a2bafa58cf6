// Package config owns the node agent's configuration file: the versioned YAML
// document (apiVersion rdmavisor.io/v1alpha1, kind AgentConfig) that the
// operator renders into a ConfigMap and the node agent, device plugin and CNI
// installer read. Load decodes strictly, fills defaults and validates.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"

	"sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/rdmavisor/rdmavisor/internal/transport"
)

// APIVersion and Kind identify an agent configuration document.
const (
	APIVersion = "rdmavisor.io/v1alpha1"
	Kind       = "AgentConfig"
)

// Provider names the verbs backend.
type Provider string

// Providers.
const (
	ProviderSoft    Provider = "soft"
	ProviderIBVerbs Provider = "ibverbs"
)

// Wire is how the soft provider carries RoCEv2 packets.
type Wire string

// WireUDP is RoCEv2 over UDP sockets, the only wire between nodes (the
// in-memory fabric exists only inside tests).
const WireUDP Wire = "udp"

// Transport is the QP type policy, a transport.Kind as the document spells
// it. Kind converts it; the constants name the values Kind accepts.
type Transport string

// Kind is the transport the document names, or an error for a name
// transport.Parse does not know.
func (t Transport) Kind() (transport.Kind, error) { return transport.Parse(string(t)) }

// Transports.
const (
	TransportRC   Transport = "rc"
	TransportUC   Transport = "uc"
	TransportUD   Transport = "ud"
	TransportAuto Transport = "auto"
)

// DiscoveryMode is how an agent finds its peers.
type DiscoveryMode string

// Discovery modes.
const (
	// DiscoveryKubernetes reads peers from RDMANode objects.
	DiscoveryKubernetes DiscoveryMode = "kubernetes"
	// DiscoveryStatic uses the peer list in the file (standalone mode).
	DiscoveryStatic DiscoveryMode = "static"
)

// Defaults.
const (
	DefaultUDPPort         = 4791 // the IANA RoCEv2 port
	DefaultControlPort     = 7471
	DefaultMetricsAddress  = ":7472"
	DefaultQPsPerPeer      = transport.DefaultQPsPerPeer
	DefaultBufferPoolBytes = 64 << 20
	DefaultVConnsPerNode   = 1024
	DefaultMaxMessageBytes = transport.DefaultMaxMessage
	DefaultResourceName    = "rdmavisor.io/vconn"
	DefaultSocketDir       = "/var/run/rdmavisor"
	DefaultAdminSocket     = DefaultSocketDir + "/admin.sock"
	DefaultStateDir        = "/var/lib/rdmavisor"
)

// Bounds checked by Validate. They match the RDMAService schema.
const (
	MaxQPsPerPeer      = transport.MaxQPsPerPeer
	MinBufferPoolBytes = 1 << 20
	MaxBufferPoolBytes = 64 << 30
	MaxVConnsPerNode   = 65536
	MaxMaxMessageBytes = 1 << 30
	MaxPollers         = 64 // the engine's bound
	MaxRails           = 16 // devices an agent serves (device.rails): more than a node has NICs
)

// AgentConfig is the node agent's configuration.
type AgentConfig struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`

	// NodeName is the node the agent runs on. Usually empty in the file,
	// which is shared by every node: the agent fills it from the
	// environment (see ApplyNode).
	NodeName string `json:"nodeName,omitempty"`
	// ServiceName is the RDMAService the agent belongs to, written into its
	// RDMANode. Empty in standalone mode.
	ServiceName string `json:"serviceName,omitempty"`

	Device DeviceConfig `json:"device"`
	Soft   SoftConfig   `json:"soft"`

	Transport       Transport `json:"transport"`
	QPsPerPeer      int       `json:"qpsPerPeer"`
	BufferPoolBytes int64     `json:"bufferPoolBytes"`
	VConnsPerNode   int       `json:"vconnsPerNode"`
	MaxMessageBytes int64     `json:"maxMessageBytes"`
	// Pollers is how many goroutines poll the engine's completion queues,
	// each with a CQ of its own; under load each keeps a core busy. Zero
	// (the default): one per CPU the agent is given, DefaultPollers. A
	// peer's QP i is polled by poller i mod Pollers, so with few peers,
	// pollers beyond a peer's QPs (qpsPerPeer, twice that with auto's UC
	// QPs) have little to do.
	Pollers int `json:"pollers,omitempty"`
	// ResourceName is the extended resource the device plugin advertises.
	ResourceName string `json:"resourceName"`

	// SocketDir holds the per-allocation sockets handed to pods.
	SocketDir string `json:"socketDir"`
	// SocketUID and SocketGID own every allocation's socket, which is
	// mode 0660: a pod connects as that user, as root with
	// CAP_DAC_OVERRIDE (a container's default), or with the group among
	// its supplementalGroups. The kubelet's device plugin API does not
	// tell Allocate which pod it serves, so the socket cannot be the
	// pod's own user's. Zero: root.
	SocketUID int `json:"socketUID,omitempty"`
	SocketGID int `json:"socketGID,omitempty"`
	// AdminSocket is the agent's local control socket, used by the device
	// plugin, the CNI plugin and the CLI.
	AdminSocket string `json:"adminSocket"`
	// ControlPort is the TCP port of the agent-to-agent gRPC control plane.
	ControlPort int `json:"controlPort"`
	// MetricsAddress serves /metrics, /healthz and /readyz.
	MetricsAddress string `json:"metricsAddress"`

	PeerDiscovery PeerDiscovery `json:"peerDiscovery"`

	// Limits bound what one allocation (one pod) may hold of the agent.
	Limits Limits `json:"limits"`

	// TLS authenticates the agent-to-agent control plane. Empty: no
	// authentication (a test or a lab; the agent says so in its log).
	TLS TLSConfig `json:"tls,omitempty"`

	// StateDir holds what must outlive the node's processes and reboots
	// (socketDir is usually on a tmpfs): the device plugin's key of
	// allocation ids, which a pod's mount names for as long as the pod
	// lives.
	StateDir string `json:"stateDir"`
}

// Limits bound what one allocation may hold of its agent, so that one
// tenant cannot exhaust the agent for the others, and RegisteredBytes
// what all of them together may. A request past a limit fails with the
// protocol's limit code; nothing else is affected.
type Limits struct {
	// Sessions: connections to the allocation's socket at once.
	Sessions int `json:"sessions"`
	// Listeners: ports listened on at once.
	Listeners int `json:"listeners"`
	// Regions: regions exported at once, over all its vconns, each
	// counted until its memory is deregistered (see RegionBytes).
	Regions int `json:"regions"`
	// RegionBytes: memory those regions register, in bytes, and the
	// staging memory of its vconns' one-sided operations (the pod
	// protocol's Stage; not a region). A region counts until its memory
	// is deregistered: after its unexport, once the peer confirmed it
	// stopped using it; after its vconn ended, once the engine's grace
	// for operations in flight passed (seconds). Staging memory counts
	// until its vconn ended.
	RegionBytes int64 `json:"regionBytes"`
	// QueuedBytes: message bytes the agent holds in its own memory for
	// the allocation, in each direction: received messages taken from
	// the engine and not yet handed to the pod (over its socket or a
	// shared-memory ring), and payloads the pod sent that wait for the
	// engine. A received message that does not fit waits in the engine,
	// holding its receive credit, so the peer's sender stops; a send that
	// does not fit fails with the limit code, and so do the later sends
	// of its vconn.
	QueuedBytes int64 `json:"queuedBytes"`
	// RegisteredBytes: memory the regions of all the node's allocations
	// together register, in bytes, counted as RegionBytes is. Registered
	// memory is pinned (with ibverbs the kernel cannot page or reclaim
	// it): this bounds what the agent pins for tenants whatever their
	// number, where RegionBytes bounds each one. It is shared fairly, not
	// first come, first served: an allocation may hold at most its fair
	// share, RegisteredBytes divided by the allocations holding registered
	// memory, itself included (max-min fairness, each holder presumed to
	// want its share). A lone allocation may use it all; one over its
	// share when others arrive keeps what it holds but claims no more
	// until it is back under.
	RegisteredBytes int64 `json:"registeredBytes"`
	// MessageRate: messages per second the allocation may send, over all
	// its vconns. ByteRate: their bytes per second. Zero: unlimited. An
	// allocation past its rate is slowed, never failed: its sends wait
	// for the rate's tokens (a token bucket holding a tenth of a second's
	// worth, at least one message or byte; a message larger than that
	// goes once the bucket is full, and the bucket owes the rest).
	MessageRate int   `json:"messageRate,omitempty"`
	ByteRate    int64 `json:"byteRate,omitempty"`
}

// Default limits, and the largest allowed.
const (
	DefaultSessions    = 64
	DefaultListeners   = 256
	DefaultRegions     = 1024
	DefaultRegionBytes = 1 << 30
	// DefaultQueuedBytes: 64 MiB a direction. A vconn holds at most one
	// received message (of at most 64 KiB, the pod protocol's largest
	// payload) on its way to the pod, and the pod's send window (16
	// operations of at most 64 KiB) on the way out: 64 MiB lets the
	// default vconnsPerNode (1024) all receive at once, and 64 vconns
	// stream at full window at once, while a pod whose peer or
	// application stalls holds at most this much of the agent's memory.
	DefaultQueuedBytes = 64 << 20
	// DefaultRegisteredBytes: 4 GiB, four allocations at the default
	// regionBytes; size it to the memory the node can leave pinned (and
	// the agent's memlock limit, with ibverbs).
	DefaultRegisteredBytes = 4 << 30
	MaxSessions            = 4096
	MaxListeners           = 65535
	MaxRegions             = 1 << 20
	MaxRegionBytes         = 64 << 30
	// MinQueuedBytes is the largest message the agent hands to a pod or
	// takes from it (frame.MaxPayload): a smaller limit would refuse it.
	MinQueuedBytes = 64 << 10
	// MaxQueuedBytes: the most one allocation may hold; past 16 GiB the
	// limit no longer protects a node's memory.
	MaxQueuedBytes = 16 << 30
	// MaxRegisteredBytes: 1 TiB, more than a node pins in practice.
	MaxRegisteredBytes = 1 << 40
	// MaxMessageRate and MaxByteRate (1 TiB a second) are past what an
	// agent sends: a rate above them limits nothing.
	MaxMessageRate = 100_000_000
	MaxByteRate    = 1 << 40
)

// TLSConfig names the agent's node certificate, its key and the cluster's
// CA bundle: files of a mounted Secret, reloaded when they change.
type TLSConfig struct {
	CertFile string `json:"certFile,omitempty"`
	KeyFile  string `json:"keyFile,omitempty"`
	CAFile   string `json:"caFile,omitempty"`
}

// Enabled reports whether mutual TLS is configured.
func (t TLSConfig) Enabled() bool { return t != TLSConfig{} }

// DeviceConfig selects the RDMA devices.
type DeviceConfig struct {
	Provider Provider `json:"provider"`
	// Names and Vendors narrow the devices of the ibverbs provider; empty
	// means all.
	Names   []string `json:"names,omitempty"`
	Vendors []string `json:"vendors,omitempty"`
	// Port of the ibverbs device (zero: port 1) and GIDIndex, the entry of
	// its GID table that addresses it (nil: an IPv4-mapped RoCE v2 GID,
	// else the first usable one).
	Port     int  `json:"port,omitempty"`
	GIDIndex *int `json:"gidIndex,omitempty"`
	// Rails is how many devices the agent serves, an engine each
	// (multi-rail); 0 or 1: one, the first the selector accepts. With
	// more, ibverbs opens the first Rails of Names, in order, and the soft
	// provider binds BindAddress and then Soft.RailAddresses. Rail i of a
	// node talks only to rail i of another, as rail-optimised fabrics are
	// wired.
	Rails int `json:"rails,omitempty"`
}

// SoftConfig configures the software provider.
type SoftConfig struct {
	Wire    Wire `json:"wire"`
	UDPPort int  `json:"udpPort"`
	// BindAddress is the IP the provider binds; empty means the node IP.
	BindAddress string `json:"bindAddress,omitempty"`
	// RailAddresses are the IPs of the devices of rails 1.. (Device.Rails),
	// on the same UDP port; rail 0 is BindAddress.
	RailAddresses []string `json:"railAddresses,omitempty"`
}

// PeerDiscovery says how the agent finds peer agents.
type PeerDiscovery struct {
	Mode DiscoveryMode `json:"mode"`
	// Static lists the peers in static mode.
	Static []Peer `json:"static,omitempty"`
}

// Peer is a statically configured peer agent.
type Peer struct {
	NodeName string `json:"nodeName"`
	// Address is the peer's control plane, host:port.
	Address string `json:"address"`
	// RailGIDs are the IP addresses of the peer's rails 1.. (Device.Rails),
	// by rail. Under mutual TLS they vouch for a rail's GID that the
	// peer's certificate does not name (as an RDMANode's devices do in
	// kubernetes mode).
	RailGIDs []string `json:"railGIDs,omitempty"`
}

// DefaultPollers is the number of pollers of an agent whose configuration
// leaves Pollers zero: runtime.GOMAXPROCS(0), at most MaxPollers. Since Go
// 1.25 that follows the container's CPU limit (cgroup cpu.max): all CPUs
// without a limit, else the limit rounded up, and at least 2 (so an agent
// limited to one CPU should say pollers: 1, as the operator renders from
// its CPU limit). GOMAXPROCS in the environment overrides it.
func DefaultPollers() int { return min(runtime.GOMAXPROCS(0), MaxPollers) }

// PollerCount is the number of pollers the agent runs: Pollers, or
// DefaultPollers when zero.
func (c *AgentConfig) PollerCount() int {
	if c.Pollers > 0 {
		return c.Pollers
	}
	return DefaultPollers()
}

// Default returns a configuration with every default set.
func Default() *AgentConfig {
	return &AgentConfig{
		APIVersion:      APIVersion,
		Kind:            Kind,
		Device:          DeviceConfig{Provider: ProviderIBVerbs},
		Soft:            SoftConfig{Wire: WireUDP, UDPPort: DefaultUDPPort},
		Transport:       Transport(transport.Default.String()),
		QPsPerPeer:      DefaultQPsPerPeer,
		BufferPoolBytes: DefaultBufferPoolBytes,
		VConnsPerNode:   DefaultVConnsPerNode,
		MaxMessageBytes: DefaultMaxMessageBytes,
		ResourceName:    DefaultResourceName,
		SocketDir:       DefaultSocketDir,
		AdminSocket:     DefaultAdminSocket,
		ControlPort:     DefaultControlPort,
		MetricsAddress:  DefaultMetricsAddress,
		PeerDiscovery:   PeerDiscovery{Mode: DiscoveryKubernetes},
		Limits:          Limits{Sessions: DefaultSessions, Listeners: DefaultListeners, Regions: DefaultRegions, RegionBytes: DefaultRegionBytes, QueuedBytes: DefaultQueuedBytes, RegisteredBytes: DefaultRegisteredBytes},
		StateDir:        DefaultStateDir,
	}
}

// Load decodes a configuration document, fills defaults and validates it.
// Unknown and duplicate fields are errors, so a typo is not silently ignored.
// A field present in the document keeps its value even when it is zero, so
// `qpsPerPeer: 0` is reported rather than replaced by the default.
func Load(data []byte) (*AgentConfig, error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, fmt.Errorf("agent config is empty")
	}
	// Decoding onto the defaults fills exactly the fields the document omits.
	cfg := Default()
	cfg.APIVersion, cfg.Kind = "", ""
	if err := decodeStrict(data, cfg); err != nil {
		return nil, fmt.Errorf("decoding agent config: %w", err)
	}
	// An empty list and an absent one mean the same; keep one form so a
	// loaded config compares equal to its re-encoding.
	for _, l := range []*[]string{&cfg.Device.Names, &cfg.Device.Vendors} {
		if len(*l) == 0 {
			*l = nil
		}
	}
	if len(cfg.PeerDiscovery.Static) == 0 {
		cfg.PeerDiscovery.Static = nil
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("invalid agent config: %w", err)
	}
	return cfg, nil
}

// decodeStrict decodes YAML into cfg, rejecting duplicate keys and unknown
// fields. Field names match case-sensitively (encoding/json would accept
// QPSPerPeer for qpsPerPeer, and let it shadow the real key).
func decodeStrict(data []byte, cfg *AgentConfig) error {
	j, err := yaml.YAMLToJSONStrict(data)
	if err != nil {
		return err
	}
	strictErrs, err := json.UnmarshalStrict(j, cfg)
	if err != nil {
		return err
	}
	return errors.Join(strictErrs...)
}

// Marshal encodes the configuration as YAML, in a stable field order.
func (c *AgentConfig) Marshal() ([]byte, error) {
	out, err := yaml.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("encoding agent config: %w", err)
	}
	return out, nil
}

// ApplyNode fills what the shared file leaves to each node: the node's name
// and, for the soft provider, the node IP as bind address. The agent calls it
// with values from the downward API, then Validate again.
func (c *AgentConfig) ApplyNode(nodeName, nodeIP string) {
	if c.NodeName == "" {
		c.NodeName = nodeName
	}
	if c.Soft.BindAddress == "" {
		c.Soft.BindAddress = nodeIP
	}
}
