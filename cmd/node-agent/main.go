// Command node-agent is the RDMAvisor node agent: it owns the node's RDMA
// device, multiplexes the pods' vconns over shared QPs and talks to the
// other nodes' agents. See package internal/agent.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2/textlogger"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/metricsauth"
	"github.com/rdmavisor/rdmavisor/internal/nodecert"
	"github.com/rdmavisor/rdmavisor/internal/rdmanode"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func main() {
	path, o, log := parseFlags()
	cfg, err := agent.LoadConfig(path, o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "node-agent:", err)
		os.Exit(2)
	}
	opts := agent.Options{Config: cfg, Log: log}
	var reporter *rdmanode.Reporter
	if cfg.PeerDiscovery.Mode == config.DiscoveryKubernetes {
		if opts.Discovery, reporter, err = rdmanode.New(cfg, log); err != nil {
			log.Error(err, "Cannot join the cluster")
			os.Exit(1)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := certificate(ctx, cfg, &opts, log); err != nil {
		os.Exit(1)
	}
	if reporter != nil {
		// /metrics over TLS to whom the cluster authorizes (the probes
		// stay plain HTTP).
		guard, err := metricsauth.New(ctx, metricsauth.Options{Kube: reporter.Kube, Log: log.WithName("metrics"),
			Public: []string{"/healthz", "/readyz"}, Hosts: []string{cfg.NodeName}})
		if err != nil {
			log.Error(err, "Cannot serve the metrics securely")
			os.Exit(1)
		}
		opts.MetricsGuard = guard
	}
	// The reporter reports the agent, or, until it starts, why its device
	// does not open.
	var node rdmanode.Pending
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		if reporter != nil {
			reporter.Run(ctx, &node) // marks the node not ready when ctx ends
		}
	}()
	exit := func(code int) {
		stop()
		<-reported
		os.Exit(code)
	}
	if !openDevices(ctx, cfg, &opts, &node, log) {
		log.Info("Stopped waiting for the RDMA device")
		<-reported
		return
	}
	if reporter != nil && !clusterOptions(ctx, reporter, cfg, &opts, log) {
		exit(1)
	}
	a, err := agent.New(opts)
	if err != nil {
		log.Error(err, "Cannot start the agent")
		exit(1)
	}
	node.Start(a)
	<-ctx.Done()
	log.Info("Stopping the agent")
	<-reported
	if err := a.Close(); err != nil {
		log.Error(err, "Stopping the agent")
		os.Exit(1)
	}
}

func parseFlags() (path string, o agent.Overrides, log logr.Logger) {
	var v int
	flag.StringVar(&path, "config", "", "agent configuration file (AgentConfig YAML); empty: defaults with the soft provider")
	flag.StringVar(&o.NodeName, "node-name", "", "node name (default $NODE_NAME)")
	flag.StringVar(&o.NodeIP, "node-ip", "", "node IP, which the soft provider binds (default $NODE_IP)")
	flag.StringVar(&o.SocketDir, "socket-dir", "", "directory of the admin and allocation sockets")
	flag.IntVar(&o.ControlPort, "control-port", 0, "TCP port of the agent-to-agent control plane")
	flag.StringVar(&o.Peers, "peers", "", "static peers, name=host:port,... (standalone mode)")
	flag.IntVar(&v, "v", 0, "log verbosity")
	flag.Parse()
	return path, o, textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v)))
}

// certificate gets the control plane's certificate before the agent
// starts (it refuses to start without its files) and keeps renewing it
// beside it; an error is logged.
func certificate(ctx context.Context, cfg *config.AgentConfig, opts *agent.Options, log logr.Logger) error {
	var certs client.Client
	if nodecert.Needed(cfg) {
		var err error
		if certs, err = nodecert.NewClient(); err != nil {
			log.Error(err, "Cannot request the node certificate")
			return err
		}
	}
	keeper, err := nodecert.Bootstrap(ctx, cfg, certs, nodecert.DefaultBootstrapTimeout, log)
	if err != nil {
		log.Error(err, "Cannot get the node certificate")
		return err
	}
	if keeper != nil {
		go keeper.Run(ctx)
		opts.RenewCertificate = keeper.Renew
	}
	return nil
}

// openDevices waits for every rail's device (one unless device.rails says
// more) and gives them to the agent; false if ctx ended first. A device
// that does not open (none, a wrong name, a port down, a GID index out of
// range) is waited for, not exited on: exiting would crash-loop the pod
// with nothing said where the operator looks.
func openDevices(ctx context.Context, cfg *config.AgentConfig, opts *agent.Options, node *rdmanode.Pending, log logr.Logger) bool {
	var rails []verbs.Device
	openRails := func(c *config.AgentConfig) (verbs.Device, error) {
		devs, err := device.OpenRails(c)
		if err != nil {
			return nil, err
		}
		rails = devs
		return devs[0], nil
	}
	if _, err := waitForDevice(ctx, cfg, openRails, device.DefaultBackoff, log, node, opts.MetricsGuard); err != nil {
		return false
	}
	opts.OpenRails = func(*config.AgentConfig) ([]verbs.Device, error) { return rails, nil }
	return true
}

// clusterOptions wires what Kubernetes mode adds: Events on pods, pod
// addresses from the API server, and the cluster's NetworkPolicies on
// dials (the CNI enforces them on IP only; vconns flow agent to agent).
// False, logged, if the watches cannot start.
func clusterOptions(ctx context.Context, reporter *rdmanode.Reporter, cfg *config.AgentConfig, opts *agent.Options, log logr.Logger) bool {
	opts.PodEvents = rdmanode.NewPodEvents(ctx, reporter.Kube, cfg.NodeName)
	pods, pols, err := watchPods(ctx, reporter.Kube, log)
	if err != nil {
		log.Error(err, "Cannot watch the pods and NetworkPolicies")
		return false
	}
	opts.PodAddresses = pods
	opts.Policy = pols
	waitPodIPs(ctx, pods, pols, log)
	return true
}
