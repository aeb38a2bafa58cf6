// Command dra-driver is RDMAvisor's Dynamic Resource Allocation driver:
// it publishes the node agent's RDMA endpoints as devices with a
// consumable vconns capacity and turns a prepared claim into an agent
// allocation delivered by CDI. See package internal/dra.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/textlogger"

	"github.com/rdmavisor/rdmavisor/internal/cdispec"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/dra"
)

func main() {
	var (
		path, kubeconfig, sysfs string
		o                       dra.Options
		v                       int
	)
	flag.StringVar(&path, "config", "", "agent configuration file (AgentConfig YAML); empty: the defaults")
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig file; empty: in-cluster")
	flag.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "the node's name (default $NODE_NAME)")
	flag.StringVar(&o.DriverName, "driver-name", dra.DefaultDriverName, "the DRA driver's name, as DeviceClasses select it")
	flag.StringVar(&o.CDISpecDir, "cdi-spec-dir", cdispec.DefaultDir, "where the claims' CDI specs are written")
	flag.StringVar(&o.KeyFile, "key-file", "", "the key of the claims' allocation ids, made there if missing; empty: allocation-id.key in the kubelet's plugin directory of the driver")
	flag.StringVar(&sysfs, "sysfs-root", "/sys", "sysfs, where the RDMA devices' NUMA nodes and PCI roots are read")
	flag.DurationVar(&o.SyncInterval, "sync-interval", dra.DefaultSyncInterval, "how often the agent is probed, devices published and allocations synced")
	flag.IntVar(&v, "v", 0, "log verbosity")
	flag.Parse()
	if o.KeyFile == "" {
		o.KeyFile = dra.KeyFileFor(o.DriverName)
	}
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v)))
	o.Log = log

	cfg := config.Default()
	if path != "" {
		data, err := os.ReadFile(path)
		if err == nil {
			cfg, err = config.Load(data)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "dra-driver: %s: %v\n", path, err)
			os.Exit(2)
		}
	}
	o.SocketDir = cfg.SocketDir
	o.Agent = deviceplugin.AdminAgent{Path: cfg.AdminSocket}
	var err error
	if o.Rails, err = deviceplugin.Rails(sysfs, cfg.Device); err != nil {
		log.Error(err, "Cannot read the RDMA devices' topology; publishing none")
	}
	d, err := dra.New(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dra-driver:", err)
		os.Exit(2)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dra-driver:", err)
		os.Exit(2)
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dra-driver:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx = klog.NewContext(ctx, log)
	log.Info("Starting the DRA driver", "driver", o.DriverName, "node", o.NodeName, "rails", len(o.Rails))
	if err := d.Run(ctx, kube); err != nil {
		log.Error(err, "DRA driver failed")
		os.Exit(1)
	}
	log.Info("Stopped the DRA driver")
}
