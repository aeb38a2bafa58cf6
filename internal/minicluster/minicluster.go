// Package minicluster runs a cluster of node agents in one process, for
// rdmavisor demo and (through agenttest) the tests: two agents, "node-a"
// on 127.0.0.2 and "node-b" on 127.0.0.3, each with a software RDMA device
// on UDP, static peers, and its own socket directory.
package minicluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// Options configure a Cluster.
type Options struct {
	Log logr.Logger
	// Transport of the agents' vconns (default rc).
	Transport config.Transport
	// VConnsPerNode bounds each node's allocations (default 65536).
	VConnsPerNode int
	// TuneEngine adjusts the engines' configuration.
	TuneEngine func(*engine.Config)
	// HeartbeatTimeout declares a silent peer gone (default 4s: on a
	// loaded 2-core machine under -race, gRPC beats were seen to stall
	// past 1s, failing tests that have nothing to do with heartbeats).
	// Beats go every quarter of it, at most every 250ms.
	HeartbeatTimeout time.Duration
	// TLS authenticates the agents' control plane with certificates from
	// a CA the cluster makes (the Cluster's CA).
	TLS bool
	// TuneConfig adjusts each agent's configuration last.
	TuneConfig func(*config.AgentConfig)
	// TuneAgent adjusts each agent's options last (its Config is the
	// node's): tests wrap the devices it opens.
	TuneAgent func(*agent.Options)
}

// Node is one agent of the cluster.
type Node struct {
	Name  string
	IP    string
	Agent *agent.Agent
	// Config is the agent's configuration (Admin socket, socket dir...).
	Config *config.AgentConfig

	c *Cluster
}

// Cluster is a set of agents that know each other.
type Cluster struct {
	Nodes []*Node
	// CA signed the nodes' certificates when Options.TLS is set.
	CA   *pki.CA
	opts Options
	dir  string
}

// Start starts node-a on 127.0.0.2 and node-b on 127.0.0.3.
func Start(o Options) (_ *Cluster, err error) {
	if o.Transport == "" {
		o.Transport = config.TransportRC
	}
	if o.VConnsPerNode == 0 {
		o.VConnsPerNode = config.MaxVConnsPerNode
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = 4 * time.Second
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	// Short: socket paths must fit in 107 bytes.
	dir, err := os.MkdirTemp("", "rv")
	if err != nil {
		return nil, err
	}
	c := &Cluster{opts: o, dir: dir}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	port, err := freeUDPPort("127.0.0.2", "127.0.0.3")
	if err != nil {
		return nil, err
	}
	ctl := make([]net.Listener, 2)
	for i, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		if ctl[i], err = net.Listen("tcp", ip+":0"); err != nil {
			return nil, err
		}
	}
	names := []string{"node-a", "node-b"}
	if o.TLS {
		if c.CA, err = pki.NewCA("minicluster", time.Hour); err != nil {
			return nil, err
		}
	}
	for i, ip := range []string{"127.0.0.2", "127.0.0.3"} {
		cfg := config.Default()
		cfg.NodeName = names[i]
		cfg.Device.Provider = config.ProviderSoft
		cfg.Soft.UDPPort = port
		cfg.Soft.BindAddress = ip
		cfg.Transport = o.Transport
		cfg.BufferPoolBytes = 32 << 20
		cfg.MaxMessageBytes = 1 << 20
		cfg.VConnsPerNode = o.VConnsPerNode
		// Two agents share the test's machine: one poller each, not one
		// per CPU each.
		cfg.Pollers = 1
		cfg.SocketDir = filepath.Join(dir, names[i])
		cfg.AdminSocket = filepath.Join(dir, names[i], "admin.sock")
		cfg.ControlPort = ctl[i].Addr().(*net.TCPAddr).Port
		cfg.MetricsAddress = ip + ":1" // unused: a listener on port 0 serves
		if o.TLS {
			if cfg.TLS, err = c.writeCert(cfg.SocketDir, names[i], net.ParseIP(ip)); err != nil {
				return nil, err
			}
		}
		other := 1 - i
		cfg.PeerDiscovery = config.PeerDiscovery{Mode: config.DiscoveryStatic,
			Static: []config.Peer{{NodeName: names[other], Address: ctl[other].Addr().String()}}}
		if o.TuneConfig != nil {
			o.TuneConfig(cfg)
		}
		c.Nodes = append(c.Nodes, &Node{Name: names[i], IP: ip, Config: cfg, c: c})
	}
	for i, n := range c.Nodes {
		if err := n.start(ctl[i]); err != nil {
			for _, l := range ctl[i+1:] {
				_ = l.Close()
			}
			return nil, err
		}
	}
	return c, nil
}

func (n *Node) start(ctl net.Listener) error {
	o := n.c.opts
	var err error
	if ctl == nil {
		// A restart: the peers know this address.
		for i := 0; i < 50; i++ {
			if ctl, err = net.Listen("tcp", fmt.Sprintf("%s:%d", n.IP, n.Config.ControlPort)); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if err != nil {
			return err
		}
	}
	ml, err := net.Listen("tcp", n.IP+":0")
	if err != nil {
		_ = ctl.Close()
		return err
	}
	ao := agent.Options{Config: n.Config, Log: o.Log.WithName(n.Name), OpenDevice: device.Open,
		OpenRails: device.OpenRails, ControlListener: ctl, MetricsListener: ml,
		TuneEngine: o.TuneEngine, HeartbeatInterval: min(o.HeartbeatTimeout/4, 250*time.Millisecond), HeartbeatTimeout: o.HeartbeatTimeout}
	if o.TuneAgent != nil {
		o.TuneAgent(&ao)
	}
	n.Agent, err = agent.New(ao)
	if err != nil {
		_ = ctl.Close()
		_ = ml.Close()
	}
	return err
}

// Allocate creates an allocation of k vconns on the node through its admin
// socket and returns the allocation's socket path.
func (n *Node) Allocate(ctx context.Context, id string, k int) (string, error) {
	ac, err := admin.Dial(ctx, n.Config.AdminSocket)
	if err != nil {
		return "", err
	}
	defer ac.Close()
	al, err := ac.CreateAllocation(ctx, id, k)
	if err != nil {
		return "", err
	}
	return al.Socket, nil
}

// writeCert issues node's certificate for ip into dir.
func (c *Cluster) writeCert(dir, node string, ip net.IP) (config.TLSConfig, error) {
	cert, key, err := c.CA.Issue(node, []net.IP{ip}, time.Hour)
	if err != nil {
		return config.TLSConfig{}, err
	}
	t := config.TLSConfig{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), CAFile: filepath.Join(dir, "ca.crt")}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return t, err
	}
	for p, b := range map[string][]byte{t.CertFile: cert, t.KeyFile: key, t.CAFile: c.CA.CertPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			return t, err
		}
	}
	return t, nil
}

// Serve accepts vconns on ln until it closes, running handle on each in a
// goroutine of its own and closing the vconn after: the servers of the
// demo and the tests.
func Serve(ln *vconn.Listener, handle func(*vconn.Conn)) {
	for {
		c, err := ln.AcceptVConn()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			handle(c)
		}()
	}
}

// Stop stops the node's agent (a crash, as far as peers can tell).
func (n *Node) Stop() error {
	if n.Agent == nil {
		return nil
	}
	err := n.Agent.Close()
	n.Agent = nil
	return err
}

// Restart stops the agent and starts a new one with the same addresses.
// Allocations are not kept: the device plugin re-creates them.
func (n *Node) Restart() error {
	if err := n.Stop(); err != nil {
		return err
	}
	return n.start(nil)
}

// Close stops every agent and removes the socket directories.
func (c *Cluster) Close() error {
	var errs []error
	for _, n := range c.Nodes {
		errs = append(errs, n.Stop())
	}
	errs = append(errs, os.RemoveAll(c.dir))
	return errors.Join(errs...)
}

// freeUDPPort finds a UDP port free on every address.
func freeUDPPort(addrs ...string) (int, error) {
	for try := 0; try < 20; try++ {
		first, err := net.ListenPacket("udp", addrs[0]+":0")
		if err != nil {
			return 0, err
		}
		port := first.LocalAddr().(*net.UDPAddr).Port
		conns := []net.PacketConn{first}
		ok := true
		for _, a := range addrs[1:] {
			pc, err := net.ListenPacket("udp", fmt.Sprintf("%s:%d", a, port))
			if err != nil {
				ok = false
				break
			}
			conns = append(conns, pc)
		}
		for _, pc := range conns {
			_ = pc.Close()
		}
		if ok {
			return port, nil
		}
	}
	return 0, errors.New("minicluster: no UDP port free on every address")
}
