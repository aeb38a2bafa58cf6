package agent

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// Overrides are the command-line fields that take precedence over the
// configuration file. Zero values leave the file's value.
type Overrides struct {
	NodeName    string // default $NODE_NAME
	NodeIP      string // default $NODE_IP
	SocketDir   string // also moves the admin socket into it
	ControlPort int
	// Peers is a static peer list, "name=host:port,...": it switches
	// discovery to static mode.
	Peers string
}

// LoadConfig reads the agent configuration file at path (empty: the
// defaults with the soft provider), applies the node's identity and the
// overrides, and validates the result.
func LoadConfig(path string, o Overrides) (*config.AgentConfig, error) {
	var cfg *config.AgentConfig
	if path == "" {
		// Without a file the agent runs standalone: soft device, peers
		// from --peers.
		cfg = config.Default()
		cfg.Device.Provider = config.ProviderSoft
		cfg.PeerDiscovery.Mode = config.DiscoveryStatic
	} else {
		data, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("agent config: %w", err)
		}
		if cfg, err = config.Load(data); err != nil {
			return nil, fmt.Errorf("agent config %s: %w", path, err)
		}
	}
	if o.NodeName == "" {
		o.NodeName = os.Getenv("NODE_NAME")
	}
	if o.NodeIP == "" {
		o.NodeIP = os.Getenv("NODE_IP")
	}
	if o.NodeName != "" {
		cfg.NodeName = o.NodeName
	}
	if o.NodeIP != "" {
		cfg.Soft.BindAddress = o.NodeIP
	}
	cfg.ApplyNode(o.NodeName, o.NodeIP)
	if o.SocketDir != "" {
		cfg.SocketDir = o.SocketDir
		cfg.AdminSocket = strings.TrimSuffix(o.SocketDir, "/") + "/admin.sock"
	}
	if o.ControlPort != 0 {
		cfg.ControlPort = o.ControlPort
	}
	if o.Peers != "" {
		peers, err := ParsePeers(o.Peers)
		if err != nil {
			return nil, err
		}
		cfg.PeerDiscovery = config.PeerDiscovery{Mode: config.DiscoveryStatic, Static: peers}
	}
	var errs []error
	if cfg.NodeName == "" {
		errs = append(errs, errors.New("nodeName: not set: use --node-name or NODE_NAME"))
	}
	if cfg.Device.Provider == config.ProviderSoft && cfg.Soft.BindAddress == "" {
		errs = append(errs, errors.New("soft.bindAddress: not set: use --node-ip or NODE_IP"))
	}
	if err := cfg.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("invalid agent config: %w", err)
	}
	return cfg, nil
}

// ParsePeers reads "name=host:port,name=host:port".
func ParsePeers(s string) ([]config.Peer, error) {
	var out []config.Peer
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "=")
		if !ok || name == "" || addr == "" {
			return nil, fmt.Errorf("--peers: %q: want name=host:port", item)
		}
		out = append(out, config.Peer{NodeName: name, Address: addr})
	}
	return out, nil
}
