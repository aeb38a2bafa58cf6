package demo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// NodeOptions describe one node of the network-namespace demo: its agent,
// and an echo server or the client on top of it.
type NodeOptions struct {
	Server           bool
	Name, IP         string
	PeerName, PeerIP string
	// Provider of the node's device (default soft); ibverbs needs a
	// binary built with the ibverbs tag (make test-rxe runs the demo so on
	// the kernel's rxe).
	Provider config.Provider
	// Transport of the agents' vconns (default: the agent's, auto).
	Transport config.Transport
	AgentsOptions
}

// Ports of the demo's agents: each node has its own network namespace, so
// both use the standard ones.
const (
	demoUDPPort     = config.DefaultUDPPort
	demoControlPort = 7471
	demoServicePort = 7
	readyLine       = "node ready"
)

// CanUseNetns reports whether this process can build network namespaces:
// root, with iproute2.
func CanUseNetns() bool {
	if os.Geteuid() != 0 {
		return false
	}
	_, err := exec.LookPath("ip")
	return err == nil
}

// AgentsNetns is Agents with each node in a network namespace of its own,
// joined by a veth pair (10.77.0.1 and 10.77.0.2, MTU 9000 so a 4096-byte
// RDMA MTU fits): two processes, each an agent with its application, as
// two hosts would run them. self is the executable to run the nodes with
// (its "demo --node" mode calls RunNode).
func AgentsNetns(ctx context.Context, w io.Writer, o AgentsOptions, self string) (err error) {
	id := strconv.Itoa(os.Getpid())
	nsA, nsB := "rvdemo-a-"+id, "rvdemo-b-"+id
	ifA, ifB := "rva"+id, "rvb"+id
	ip := func(args ...string) error {
		out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("demo: ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	defer func() {
		// Deleting a namespace deletes its end of the veth pair, and so
		// the pair.
		for _, ns := range []string{nsA, nsB} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	}()
	for _, args := range [][]string{
		{"netns", "add", nsA}, {"netns", "add", nsB},
		{"link", "add", ifA, "type", "veth", "peer", "name", ifB},
		{"link", "set", ifA, "netns", nsA}, {"link", "set", ifB, "netns", nsB},
		{"-n", nsA, "addr", "add", "10.77.0.1/24", "dev", ifA},
		{"-n", nsB, "addr", "add", "10.77.0.2/24", "dev", ifB},
		{"-n", nsA, "link", "set", ifA, "mtu", "9000", "up"}, {"-n", nsB, "link", "set", ifB, "mtu", "9000", "up"},
		{"-n", nsA, "link", "set", "lo", "up"}, {"-n", nsB, "link", "set", "lo", "up"},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "agents: node-a in netns %s (10.77.0.1), node-b in netns %s (10.77.0.2), veth MTU 9000\n", nsA, nsB)
	node := func(ns string, server bool, name, addr, peer, peerAddr string) *exec.Cmd {
		args := []string{"netns", "exec", ns, self, "demo", "--node",
			"--server=" + strconv.FormatBool(server), "--name=" + name, "--ip=" + addr,
			"--peer-name=" + peer, "--peer-ip=" + peerAddr,
			"--vconns=" + strconv.Itoa(o.VConns), "--rounds=" + strconv.Itoa(o.Messages), "--size=" + strconv.Itoa(o.Size),
			"--pollers=" + strconv.Itoa(o.Pollers)}
		cmd := exec.CommandContext(ctx, "ip", args...)
		cmd.Stderr = os.Stderr
		cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
		return cmd
	}
	srv := node(nsB, true, "node-b", "10.77.0.2", "node-a", "10.77.0.1")
	out, err := srv.StdoutPipe()
	if err != nil {
		return err
	}
	if err := srv.Start(); err != nil {
		return fmt.Errorf("demo: start node-b: %w", err)
	}
	defer func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		if werr := srv.Wait(); werr != nil && err == nil {
			err = fmt.Errorf("demo: node-b: %w", werr)
		}
	}()
	lines := bufio.NewScanner(out)
	ready := false
	for !ready && lines.Scan() {
		ready = lines.Text() == readyLine
	}
	if !ready {
		return errors.New("demo: node-b exited before it was ready")
	}
	go func() {
		for lines.Scan() {
			fmt.Fprintln(w, lines.Text())
		}
	}()
	cl := node(nsA, false, "node-a", "10.77.0.1", "node-b", "10.77.0.2")
	cl.Stdout = w
	if err := cl.Run(); err != nil {
		return fmt.Errorf("demo: node-a: %w", err)
	}
	return nil
}

// RunNode runs one node of the network-namespace demo in this process's
// namespace: an agent on o.IP with o.PeerName at o.PeerIP as its static
// peer, an allocation, and either an echo server (until ctx ends) or the
// client's ping-pong over o.VConns vconns.
func RunNode(ctx context.Context, w io.Writer, o NodeOptions) (err error) {
	o.AgentsOptions = o.withDefaults()
	dir, err := os.MkdirTemp("", "rvdemo")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := nodeConfig(&o, dir)
	ml, err := net.Listen("tcp", net.JoinHostPort(o.IP, "0"))
	if err != nil {
		return err
	}
	a, err := agent.New(agent.Options{Config: cfg, Log: logr.Discard(), OpenDevice: device.Open, MetricsListener: ml, TuneEngine: o.tune})
	if err != nil {
		_ = ml.Close()
		return fmt.Errorf("demo: %s: %w", o.Name, err)
	}
	defer func() { err = errors.Join(err, a.Close()) }()
	ac, err := admin.Dial(ctx, cfg.AdminSocket)
	if err != nil {
		return err
	}
	quota := o.VConns
	if o.Server {
		quota += 64 // the client's reachability probe may still be closing
	}
	al, err := createAllocation(ctx, ac, quota)
	_ = ac.Close()
	if err != nil {
		return err
	}
	c, err := vconn.NewClient(ctx, vconn.Options{Socket: al.Socket})
	if err != nil {
		return err
	}
	defer c.Close()
	stats := func() string {
		s := a.Engine().Stats()
		return fmt.Sprintf("%s: vconns open %d, RC QPs it created %d (to %d peer), %d pollers", o.Name, s.VConns, s.QPs, s.Peers, a.Engine().Config().Pollers)
	}
	// What the engine saw of the wire, also when the run failed: for
	// telling loss from a stalled peer.
	defer func() {
		s := a.Engine().Stats()
		fmt.Fprintf(w, "%s: messages sent %d, received %d; Auto retransmits %d (%d on a gap report); stale %d, malformed %d dropped\n",
			o.Name, s.MsgsSent, s.MsgsReceived, s.Retransmits, s.GapResends, s.StaleDropped, s.Malformed)
	}()
	if o.Server {
		return serveNode(ctx, w, c, stats)
	}
	addr := net.JoinHostPort(o.PeerName, strconv.Itoa(demoServicePort))
	if err := awaitPeer(ctx, c, addr, o.PeerName); err != nil {
		return err
	}
	return roundTrips(ctx, w, c, addr, o.AgentsOptions, stats)
}

// nodeConfig is the configuration of node o's agent, its sockets in dir.
func nodeConfig(o *NodeOptions, dir string) *config.AgentConfig {
	cfg := config.Default()
	cfg.NodeName = o.Name
	if o.Transport != "" {
		cfg.Transport = o.Transport
	}
	cfg.Device.Provider = o.Provider
	if cfg.Device.Provider == "" {
		cfg.Device.Provider = config.ProviderSoft
	}
	cfg.Soft.UDPPort = demoUDPPort
	cfg.Soft.BindAddress = o.IP
	cfg.BufferPoolBytes = 32 << 20
	cfg.MaxMessageBytes = 1 << 20
	cfg.VConnsPerNode = max(o.VConns+64, 1024)
	cfg.SocketDir = filepath.Join(dir, "sockets")
	cfg.AdminSocket = filepath.Join(dir, "sockets", "admin.sock")
	cfg.ControlPort = demoControlPort
	cfg.PeerDiscovery = config.PeerDiscovery{Mode: config.DiscoveryStatic,
		Static: []config.Peer{{NodeName: o.PeerName, Address: net.JoinHostPort(o.PeerIP, strconv.Itoa(demoControlPort))}}}
	return cfg
}

// serveNode echoes on the demo's service port until ctx ends, then prints
// the engine's stats.
func serveNode(ctx context.Context, w io.Writer, c *vconn.Client, stats func() string) error {
	ln, err := c.Listen(ctx, ":"+strconv.Itoa(demoServicePort))
	if err != nil {
		return err
	}
	defer ln.Close()
	go echo(ctx, ln)
	fmt.Fprintln(w, readyLine)
	<-ctx.Done()
	fmt.Fprintln(w, stats())
	return nil
}

// awaitPeer dials the server at addr until it answers: its agent is up;
// this gives the control plane a moment to see it.
func awaitPeer(ctx context.Context, c *vconn.Client, addr, peer string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		conn, err := c.Dial(ctx, addr)
		if err == nil {
			_ = conn.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("demo: reach %s: %w", peer, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// createAllocation makes the node's allocation, waiting while the agent
// says it cannot now (a link that comes up a moment after the agent
// started: its rail is down until then), within ctx and railWait.
func createAllocation(ctx context.Context, ac *admin.Client, quota int) (admin.Allocation, error) {
	ctx, cancel := context.WithTimeout(ctx, railWait)
	defer cancel()
	for {
		al, err := ac.CreateAllocation(ctx, "demo", quota)
		if !errors.Is(err, admin.ErrUnavailable) {
			return al, err
		}
		select {
		case <-ctx.Done():
			return al, fmt.Errorf("demo: waited %s for a rail to come up: %w", railWait, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// railWait bounds how long a node waits for its link to come up.
const railWait = time.Minute
