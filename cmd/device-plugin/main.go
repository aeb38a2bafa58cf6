// Command device-plugin is RDMAvisor's kubelet device plugin: it
// advertises the node's vconns and turns a container's share of them into
// an allocation of the node agent. See package internal/deviceplugin.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/textlogger"

	"github.com/rdmavisor/rdmavisor/internal/cdispec"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/deviceplugin"
	"github.com/rdmavisor/rdmavisor/internal/metricsauth"
)

func main() {
	var (
		path    string
		o       deviceplugin.Options
		metrics string
		v       int
		sysfs   string
	)
	flag.StringVar(&path, "config", "", "agent configuration file (AgentConfig YAML); empty: the defaults")
	flag.StringVar(&o.KubeletDir, "kubelet-dir", deviceplugin.DefaultKubeletDir, "the kubelet's device-plugin directory (kubelet.sock and the plugin's socket)")
	flag.StringVar(&o.PodResourcesSocket, "pod-resources-socket", deviceplugin.DefaultPodResourcesSocket, "the kubelet pod-resources API socket")
	flag.StringVar(&metrics, "metrics-address", ":7473", "address serving /metrics and /healthz; empty: none")
	flag.DurationVar(&o.HealthInterval, "health-interval", deviceplugin.DefaultHealthInterval, "how often the agent's health is probed")
	flag.DurationVar(&o.GCInterval, "gc-interval", deviceplugin.DefaultGCInterval, "how often allocations of pods that are gone are deleted")
	flag.DurationVar(&o.GCGrace, "gc-grace", deviceplugin.DefaultGCGrace, "age under which an allocation this process made is never collected")
	flag.DurationVar(&o.RetryInterval, "retry-interval", deviceplugin.DefaultRetryInterval, "delay between failed registrations")
	flag.BoolVar(&o.CDI, "cdi", false, "add a CDI device <resourceName>=<allocation> to every container, and write its spec")
	flag.StringVar(&o.CDISpecDir, "cdi-spec-dir", cdispec.DefaultDir, "where the CDI specs are written (the runtime's dynamic spec directory)")
	flag.StringVar(&sysfs, "sysfs-root", "/sys", "sysfs, where the RDMA devices' NUMA nodes are read (ibverbs provider)")
	flag.IntVar(&v, "v", 0, "log verbosity")
	flag.Parse()
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v)))

	cfg, err := loadConfig(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "device-plugin:", err)
		os.Exit(2)
	}
	o.Config = cfg
	o.Log = log
	if o.Rails, err = deviceplugin.Rails(sysfs, cfg.Device); err != nil {
		// Topology is a preference: serve without it rather than not at all.
		log.Error(err, "Cannot read the RDMA devices' topology; advertising none")
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	o.Registerer = reg
	p, err := deviceplugin.New(o)
	if err != nil {
		fmt.Fprintln(os.Stderr, "device-plugin:", err)
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			p.Restart()
		}
	}()
	if metrics != "" {
		ln, err := net.Listen("tcp", metrics)
		if err != nil {
			log.Error(err, "Cannot serve metrics")
			os.Exit(1)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
		ln, h, err := guarded(ctx, ln, mux, log)
		if err != nil {
			log.Error(err, "Cannot serve metrics securely")
			os.Exit(1)
		}
		hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error(err, "Serving metrics")
			}
		}()
		defer hs.Close()
	}
	log.Info("Starting the device plugin", "resource", cfg.ResourceName, "devices", cfg.VConnsPerNode, "rails", len(o.Rails), "kubeletDir", o.KubeletDir)
	if err := p.Run(ctx); err != nil {
		log.Error(err, "Device plugin failed")
		os.Exit(1)
	}
	log.Info("Stopped the device plugin")
}

// guarded serves /metrics over TLS to callers the cluster authorizes
// (internal/metricsauth), as the agent does, when this runs in a pod of a
// cluster; /healthz stays open and plain. Outside a cluster (no API server
// to ask) it serves as before, and says so.
func guarded(ctx context.Context, ln net.Listener, h http.Handler, log logr.Logger) (net.Listener, http.Handler, error) {
	rc, err := rest.InClusterConfig()
	if errors.Is(err, rest.ErrNotInCluster) {
		log.Info("Not in a cluster: serving /metrics over plain HTTP, to anyone")
		return ln, h, nil
	}
	if err != nil {
		return nil, nil, err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, err
	}
	g, err := metricsauth.New(ctx, metricsauth.Options{Kube: kube, Log: log.WithName("metrics"), Public: []string{"/healthz"}})
	if err != nil {
		return nil, nil, err
	}
	return g.Listen(ln), g.Wrap(h), nil
}

// loadConfig reads the agent configuration file (empty path: the
// defaults). The device plugin needs no node identity, only the resource
// name, vconns per node and socket paths.
func loadConfig(path string) (*config.AgentConfig, error) {
	if path == "" {
		return config.Default(), nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg, err := config.Load(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}
