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

	"k8s.io/klog/v2/textlogger"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/nodecert"
	"github.com/rdmavisor/rdmavisor/internal/rdmanode"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func main() {
	var (
		path string
		o    agent.Overrides
		v    int
	)
	flag.StringVar(&path, "config", "", "agent configuration file (AgentConfig YAML); empty: defaults with the soft provider")
	flag.StringVar(&o.NodeName, "node-name", "", "node name (default $NODE_NAME)")
	flag.StringVar(&o.NodeIP, "node-ip", "", "node IP, which the soft provider binds (default $NODE_IP)")
	flag.StringVar(&o.SocketDir, "socket-dir", "", "directory of the admin and allocation sockets")
	flag.IntVar(&o.ControlPort, "control-port", 0, "TCP port of the agent-to-agent control plane")
	flag.StringVar(&o.Peers, "peers", "", "static peers, name=host:port,... (standalone mode)")
	flag.IntVar(&v, "v", 0, "log verbosity")
	flag.Parse()
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v)))

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
	// The control plane's certificate comes before the agent, which
	// refuses to start without its files; renewals run beside it.
	var certs client.Client
	if nodecert.Needed(cfg) {
		if certs, err = nodecert.NewClient(); err != nil {
			log.Error(err, "Cannot request the node certificate")
			os.Exit(1)
		}
	}
	keeper, err := nodecert.Bootstrap(ctx, cfg, certs, nodecert.DefaultBootstrapTimeout, log)
	if err != nil {
		log.Error(err, "Cannot get the node certificate")
		os.Exit(1)
	}
	if keeper != nil {
		go keeper.Run(ctx)
		opts.RenewCertificate = keeper.Renew
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
	// A device that does not open (none, a wrong name, a port down, a GID
	// index out of range) is waited for, not exited on: exiting would
	// crash-loop the pod with nothing said where the operator looks.
	// Every rail's device (one unless device.rails says more) opens
	// together.
	var rails []verbs.Device
	openRails := func(c *config.AgentConfig) (verbs.Device, error) {
		devs, err := device.OpenRails(c)
		if err != nil {
			return nil, err
		}
		rails = devs
		return devs[0], nil
	}
	if _, err := waitForDevice(ctx, cfg, openRails, device.DefaultBackoff, log, &node); err != nil {
		log.Info("Stopped waiting for the RDMA device")
		<-reported
		return
	}
	opts.OpenRails = func(*config.AgentConfig) ([]verbs.Device, error) { return rails, nil }
	if reporter != nil {
		opts.PodEvents = rdmanode.NewPodEvents(ctx, reporter.Kube, cfg.NodeName)
		pods, pols, err := watchPods(ctx, reporter.Kube, log)
		if err != nil {
			log.Error(err, "Cannot watch the pods and NetworkPolicies")
			stop()
			<-reported
			os.Exit(1)
		}
		opts.PodAddresses = pods
		// Dials obey the cluster's NetworkPolicies, which the CNI
		// enforces on IP only (vconns flow agent to agent).
		opts.Policy = pols
		waitPodIPs(ctx, pods, pols, log)
	}
	a, err := agent.New(opts)
	if err != nil {
		log.Error(err, "Cannot start the agent")
		stop()
		<-reported
		os.Exit(1)
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
