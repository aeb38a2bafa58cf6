package config

import (
	"errors"
	"reflect"
	"runtime"
	"strings"
	"testing"
)

const minimal = "apiVersion: rdmavisor.io/v1alpha1\nkind: AgentConfig\n"

func TestLoadDefaults(t *testing.T) {
	cfg, err := Load([]byte(minimal))
	if err != nil {
		t.Fatalf("Load(minimal): %v", err)
	}
	if want := Default(); !reflect.DeepEqual(cfg, want) {
		t.Errorf("Load(minimal) = %+v, want the defaults %+v", cfg, want)
	}
	// Spot-check the documented defaults, so a change to Default is deliberate.
	for _, c := range []struct {
		field    string
		got, exp any
	}{
		{"soft.udpPort", cfg.Soft.UDPPort, 4791},
		{"controlPort", cfg.ControlPort, 7471},
		{"socketDir", cfg.SocketDir, "/var/run/rdmavisor"},
		{"stateDir", cfg.StateDir, "/var/lib/rdmavisor"},
		{"resourceName", cfg.ResourceName, "rdmavisor.io/vconn"},
		{"soft.bindAddress", cfg.Soft.BindAddress, ""},
		{"peerDiscovery.mode", cfg.PeerDiscovery.Mode, DiscoveryKubernetes},
	} {
		if c.got != c.exp {
			t.Errorf("default %s = %v, want %v", c.field, c.got, c.exp)
		}
	}
}

func TestLoad(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		// check inspects a config that loaded; nil when an error is expected.
		check func(t *testing.T, c *AgentConfig)
		// errs are substrings the error must contain, each naming a field.
		errs []string
	}{
		{
			name: "full soft config",
			doc: minimal + `
nodeName: node-1
serviceName: fabric
device: {provider: soft}
soft: {wire: udp, udpPort: 14791, bindAddress: 10.0.0.1}
transport: ud
qpsPerPeer: 4
bufferPoolBytes: 134217728
vconnsPerNode: 4096
maxMessageBytes: 65536
resourceName: example.com/vconn
socketDir: /run/r
adminSocket: /run/r/admin.sock
controlPort: 9000
metricsAddress: 127.0.0.1:9001
peerDiscovery:
  mode: static
  static:
  - {nodeName: node-2, address: "10.0.0.2:9000"}
  - {nodeName: node-3, address: "[fd00::3]:9000"}
`,
			check: func(t *testing.T, c *AgentConfig) {
				if c.Device.Provider != ProviderSoft || c.Soft.UDPPort != 14791 || c.Transport != TransportUD ||
					c.QPsPerPeer != 4 || c.BufferPoolBytes != 128<<20 || c.VConnsPerNode != 4096 ||
					c.ControlPort != 9000 || len(c.PeerDiscovery.Static) != 2 || c.PeerDiscovery.Static[1].Address != "[fd00::3]:9000" {
					t.Errorf("decoded %+v", c)
				}
			},
		},
		{
			name: "partial nested struct keeps the other defaults",
			doc:  minimal + "soft: {udpPort: 5000}\n",
			check: func(t *testing.T, c *AgentConfig) {
				if c.Soft.UDPPort != 5000 || c.Soft.Wire != WireUDP {
					t.Errorf("soft = %+v, want udpPort 5000 and wire udp", c.Soft)
				}
			},
		},
		{
			name: "ibverbs with device names",
			doc:  minimal + "device: {provider: ibverbs, names: [mlx5_0, mlx5_1], vendors: [mellanox]}\n",
			check: func(t *testing.T, c *AgentConfig) {
				if !reflect.DeepEqual(c.Device.Names, []string{"mlx5_0", "mlx5_1"}) {
					t.Errorf("names = %v", c.Device.Names)
				}
			},
		},
		{name: "empty document", doc: "  \n", errs: []string{"empty"}},
		{name: "missing apiVersion and kind", doc: "qpsPerPeer: 2\n", errs: []string{"apiVersion: must be", "kind: must be"}},
		{name: "wrong apiVersion", doc: "apiVersion: v1\nkind: AgentConfig\n", errs: []string{`apiVersion: must be "rdmavisor.io/v1alpha1", got "v1"`}},
		{name: "unknown field", doc: minimal + "qpsPerPeers: 3\n", errs: []string{"qpsPerPeers"}},
		{name: "unknown nested field", doc: minimal + "soft: {port: 3}\n", errs: []string{"port"}},
		{name: "duplicate field", doc: minimal + "qpsPerPeer: 3\nqpsPerPeer: 4\n", errs: []string{"qpsPerPeer"}},
		{name: "wrong type", doc: minimal + "qpsPerPeer: many\n", errs: []string{"qpsPerPeer"}},
		{name: "not yaml", doc: "{[", errs: []string{"decoding agent config"}},
		{name: "explicit zero is not defaulted", doc: minimal + "qpsPerPeer: 0\n", errs: []string{"qpsPerPeer: must be between 1 and 64, got 0"}},
		{name: "too many QPs", doc: minimal + "qpsPerPeer: 65\n", errs: []string{"qpsPerPeer"}},
		{
			name: "pollers",
			doc:  minimal + "pollers: 3\n",
			check: func(t *testing.T, c *AgentConfig) {
				if c.Pollers != 3 || c.PollerCount() != 3 {
					t.Errorf("pollers %d, count %d: want 3", c.Pollers, c.PollerCount())
				}
			},
		},
		{name: "negative pollers", doc: minimal + "pollers: -1\n", errs: []string{"pollers: must be between 1 and 64, or 0 for one per CPU, got -1"}},
		{name: "too many pollers", doc: minimal + "pollers: 65\n", errs: []string{"pollers"}},
		{name: "negative vconns", doc: minimal + "vconnsPerNode: -1\n", errs: []string{"vconnsPerNode: must be between 1 and 65536, got -1"}},
		{name: "too many vconns", doc: minimal + "vconnsPerNode: 65537\n", errs: []string{"vconnsPerNode"}},
		{name: "pool too small", doc: minimal + "bufferPoolBytes: 4096\nmaxMessageBytes: 1024\n", errs: []string{"bufferPoolBytes"}},
		{name: "message larger than pool", doc: minimal + "bufferPoolBytes: 1048576\nmaxMessageBytes: 2097152\n", errs: []string{"maxMessageBytes: must not exceed bufferPoolBytes"}},
		{name: "unknown transport", doc: minimal + "transport: tcp\n", errs: []string{`transport: must be one of rc, uc, ud, auto, got "tcp"`}},
		{name: "unknown provider", doc: minimal + "device: {provider: efa}\n", errs: []string{"device.provider"}},
		{name: "soft with device names", doc: minimal + "device: {provider: soft, names: [mlx5_0]}\n", errs: []string{"device: names and vendors"}},
		{name: "bad device name", doc: minimal + "device: {names: ['a b']}\n", errs: []string{"device.names[0]"}},
		{name: "bad device port", doc: minimal + "device: {port: 256}\n", errs: []string{"device.port"}},
		{name: "no sessions", doc: minimal + "limits: {sessions: 0}\n", errs: []string{"limits.sessions: must be between 1 and 4096, got 0"}},
		{name: "too many region bytes", doc: minimal + "limits: {regionBytes: 68719476737}\n", errs: []string{"limits.regionBytes"}},
		{name: "queued bytes under a message", doc: minimal + "limits: {queuedBytes: 65535}\n", errs: []string{"limits.queuedBytes: must be between 65536 and 17179869184, got 65535"}},
		{name: "too many queued bytes", doc: minimal + "limits: {queuedBytes: 17179869185}\n", errs: []string{"limits.queuedBytes: must be between 65536 and 17179869184, got 17179869185"}},
		{name: "no queued bytes", doc: minimal + "limits: {queuedBytes: -1}\n", errs: []string{"limits.queuedBytes: must be between 65536"}},
		{name: "no registered bytes", doc: minimal + "limits: {registeredBytes: 0}\n", errs: []string{"limits.registeredBytes: must be between 1 and 1099511627776, got 0"}},
		{name: "too many registered bytes", doc: minimal + "limits: {registeredBytes: 1099511627777}\n", errs: []string{"limits.registeredBytes: must be between 1 and 1099511627776, got 1099511627777"}},
		{name: "negative message rate", doc: minimal + "limits: {messageRate: -1}\n", errs: []string{"limits.messageRate: must be between 1 and 100000000, or 0 for unlimited, got -1"}},
		{name: "too high a message rate", doc: minimal + "limits: {messageRate: 100000001}\n", errs: []string{"limits.messageRate: must be between 1 and 100000000"}},
		{name: "too high a byte rate", doc: minimal + "limits: {byteRate: 1099511627777}\n", errs: []string{"limits.byteRate: must be between 1 and 1099511627776, or 0 for unlimited, got 1099511627777"}},
		{
			name: "rates",
			doc:  minimal + "limits: {messageRate: 1000, byteRate: 1048576}\n",
			check: func(t *testing.T, c *AgentConfig) {
				if c.Limits.MessageRate != 1000 || c.Limits.ByteRate != 1<<20 || c.Limits.Sessions != DefaultSessions {
					t.Errorf("limits %+v: want messageRate 1000, byteRate 1 MiB and the other defaults", c.Limits)
				}
			},
		},
		{
			name: "registered bytes",
			doc:  minimal + "limits: {registeredBytes: 8589934592}\n",
			check: func(t *testing.T, c *AgentConfig) {
				if c.Limits.RegisteredBytes != 8<<30 || c.Limits.RegionBytes != DefaultRegionBytes {
					t.Errorf("limits %+v: want registeredBytes 8 GiB and the other defaults", c.Limits)
				}
			},
		},
		{
			name: "queued bytes",
			doc:  minimal + "limits: {queuedBytes: 65536}\n",
			check: func(t *testing.T, c *AgentConfig) {
				if c.Limits.QueuedBytes != MinQueuedBytes || c.Limits.RegionBytes != DefaultRegionBytes {
					t.Errorf("limits %+v: want queuedBytes 65536 and the other defaults", c.Limits)
				}
			},
		},
		{
			name: "limits",
			doc:  minimal + "limits: {listeners: 3}\n",
			check: func(t *testing.T, c *AgentConfig) {
				if c.Limits != (Limits{Sessions: DefaultSessions, Listeners: 3, Regions: DefaultRegions, RegionBytes: DefaultRegionBytes, QueuedBytes: DefaultQueuedBytes, RegisteredBytes: DefaultRegisteredBytes}) {
					t.Errorf("limits %+v: want listeners 3 and the other defaults", c.Limits)
				}
			},
		},
		{name: "negative GID index", doc: minimal + "device: {gidIndex: -1}\n", errs: []string{"device.gidIndex"}},
		{name: "soft with a GID index", doc: minimal + "device: {provider: soft, gidIndex: 1}\n", errs: []string{"device: port and gidIndex"}},
		{name: "bad wire", doc: minimal + "soft: {wire: memory}\n", errs: []string{"soft.wire"}},
		{name: "bad udp port", doc: minimal + "soft: {udpPort: 70000}\n", errs: []string{"soft.udpPort"}},
		{name: "bad bind address", doc: minimal + "soft: {bindAddress: node-1}\n", errs: []string{"soft.bindAddress"}},
		{name: "too many rails", doc: minimal + "device: {rails: 17}\n", errs: []string{"device.rails: must be between 1 and 16"}},
		{name: "rails without names", doc: minimal + "device: {rails: 2, names: [mlx5_0]}\n", errs: []string{"device.rails: 2 rails of provider ibverbs need as many device.names"}},
		{name: "bad rail address", doc: minimal + "soft: {railAddresses: [node-1]}\n", errs: []string{"soft.railAddresses[0]"}},
		{name: "resource name without domain", doc: minimal + "resourceName: vconn\n", errs: []string{"resourceName: must be a domain-prefixed name"}},
		{name: "relative socket dir", doc: minimal + "socketDir: run/r\n", errs: []string{"socketDir"}},
		{name: "relative state dir", doc: minimal + "stateDir: lib/r\n", errs: []string{"stateDir: must be an absolute path"}},
		{name: "admin socket too long", doc: minimal + "adminSocket: /" + strings.Repeat("a", 120) + "\n", errs: []string{"adminSocket: must be at most 107"}},
		{name: "control port zero", doc: minimal + "controlPort: 0\n", errs: []string{"controlPort"}},
		{name: "metrics address without port", doc: minimal + "metricsAddress: localhost\n", errs: []string{"metricsAddress: must be host:port"}},
		{name: "metrics on the control port", doc: minimal + "metricsAddress: ':7471'\n", errs: []string{"metricsAddress: port 7471 is already the controlPort"}},
		{name: "bad node name", doc: minimal + "nodeName: Node_1\n", errs: []string{"nodeName"}},
		{name: "bad discovery mode", doc: minimal + "peerDiscovery: {mode: dns}\n", errs: []string{"peerDiscovery.mode"}},
		{name: "static peers in kubernetes mode", doc: minimal + "peerDiscovery: {static: [{nodeName: a, address: 'a:1'}]}\n", errs: []string{"peerDiscovery.static: must be empty"}},
		{
			name: "bad static peers",
			doc:  minimal + "peerDiscovery: {mode: static, static: [{nodeName: a, address: 'a:1'}, {nodeName: a, address: 'b'}]}\n",
			errs: []string{"peerDiscovery.static[1].nodeName: duplicate", "peerDiscovery.static[1].address: must be host:port"},
		},
		{
			name: "bad static rail GIDs",
			doc:  minimal + "peerDiscovery: {mode: static, static: [{nodeName: a, address: 'a:1', railGIDs: ['10.1.0.2', 'mlx5_1']}]}\n",
			errs: []string{`peerDiscovery.static[0].railGIDs[1]: must be an IP address, got "mlx5_1"`},
		},
		{
			name: "every error is reported, not only the first",
			doc:  minimal + "qpsPerPeer: 0\nvconnsPerNode: 0\ntransport: x\nresourceName: vconn\n",
			errs: []string{"qpsPerPeer", "vconnsPerNode", "transport", "resourceName"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Load([]byte(tt.doc))
			if tt.errs == nil {
				if err != nil {
					t.Fatalf("Load: %v", err)
				}
				tt.check(t, cfg)
				return
			}
			if err == nil {
				t.Fatalf("Load succeeded with %+v, want an error containing %q", cfg, tt.errs)
			}
			for _, want := range tt.errs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// TestDefaultPollers: an agent that leaves pollers zero runs one per CPU
// the runtime was given (GOMAXPROCS, which follows the cgroup's CPU
// limit), and the zero is not written back into the file.
func TestDefaultPollers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(3))
	c := Default()
	if c.Pollers != 0 || c.PollerCount() != 3 {
		t.Fatalf("with GOMAXPROCS 3: pollers %d, count %d; want 0 and 3", c.Pollers, c.PollerCount())
	}
	runtime.GOMAXPROCS(MaxPollers + 8)
	if n := c.PollerCount(); n != MaxPollers {
		t.Fatalf("with GOMAXPROCS %d: count %d, want the bound %d", MaxPollers+8, n, MaxPollers)
	}
	out, err := c.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "pollers") {
		t.Fatalf("a default config's YAML names pollers:\n%s", out)
	}
}

func TestValidateFieldErrors(t *testing.T) {
	cfg := Default()
	cfg.QPsPerPeer = 0
	cfg.ControlPort = -1
	err := cfg.Validate()
	var fields []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("error %v is not a *FieldError", e)
		}
		fields = append(fields, fe.Field)
	}
	if want := []string{"qpsPerPeer", "controlPort"}; !reflect.DeepEqual(fields, want) {
		t.Errorf("fields = %v, want %v", fields, want)
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	in := Default()
	in.NodeName, in.ServiceName = "node-1", "fabric"
	in.Device = DeviceConfig{Provider: ProviderSoft}
	in.PeerDiscovery = PeerDiscovery{Mode: DiscoveryStatic, Static: []Peer{{NodeName: "node-2", Address: "10.0.0.2:7471"}}}
	data, err := in.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	out, err := Load(data)
	if err != nil {
		t.Fatalf("Load(Marshal()): %v\n%s", err, data)
	}
	if !reflect.DeepEqual(in, out) {
		t.Errorf("round trip changed the config:\n in %+v\nout %+v", in, out)
	}
}

func TestApplyNode(t *testing.T) {
	tests := []struct {
		name               string
		nodeName, bindAddr string
		wantName, wantBind string
	}{
		{"fills empty fields", "", "", "node-1", "10.0.0.1"},
		{"keeps explicit values", "node-9", "10.9.9.9", "node-9", "10.9.9.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Default()
			cfg.NodeName, cfg.Soft.BindAddress = tt.nodeName, tt.bindAddr
			cfg.ApplyNode("node-1", "10.0.0.1")
			if cfg.NodeName != tt.wantName || cfg.Soft.BindAddress != tt.wantBind {
				t.Errorf("got node %q bind %q, want %q %q", cfg.NodeName, cfg.Soft.BindAddress, tt.wantName, tt.wantBind)
			}
			if err := cfg.Validate(); err != nil {
				t.Errorf("Validate: %v", err)
			}
		})
	}
}

func TestLoadIsCaseSensitive(t *testing.T) {
	for _, doc := range []string{
		minimal + "QPSPerPeer: 3\n",
		minimal + "qpsPerPeer: 3\nQpsPerPeer: 4\n",
	} {
		if cfg, err := Load([]byte(doc)); err == nil {
			t.Errorf("Load(%q) accepted a miscased key: qpsPerPeer = %d", doc, cfg.QPsPerPeer)
		}
	}
}
