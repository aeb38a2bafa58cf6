package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/rdmavisor/rdmavisor/internal/agent"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/rdmanode"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// waitForDevice opens the node's device, retrying with backoff until it
// opens or ctx ends. Every failure is logged with its reason and recorded
// in src, which the RDMANode reporter writes (Ready and DeviceReady False,
// why). Meanwhile the metrics address answers /healthz (alive: the
// kubelet must not restart an agent that only waits) and /readyz (not
// ready, and why), behind guard as the agent's (nil: none); the agent
// serves them once it starts.
func waitForDevice(ctx context.Context, cfg *config.AgentConfig, open func(*config.AgentConfig) (verbs.Device, error),
	b device.Backoff, log logr.Logger, src *rdmanode.Pending, guard agent.MetricsGuard) (verbs.Device, error) {
	var health *http.Server
	defer func() {
		if health != nil {
			_ = health.Close() // frees the address for the agent
		}
	}()
	return device.Wait(ctx, cfg, open, b, func(err error, retry time.Duration) {
		log.Error(err, "Cannot open the RDMA device; the agent waits for it and retries",
			"provider", cfg.Device.Provider, "names", cfg.Device.Names, "reason", device.Reason(err), "retryIn", retry)
		src.Fail(err)
		if health == nil {
			health = serveWaiting(cfg.MetricsAddress, src, guard, log)
		}
	})
}

// serveWaiting answers the probes of an agent waiting for its device; nil
// when the address cannot be listened on (logged: the probes then fail).
func serveWaiting(addr string, src *rdmanode.Pending, guard agent.MetricsGuard, log logr.Logger) *http.Server {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error(err, "Cannot serve the health endpoints while waiting for the device", "address", addr)
		return nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, fmt.Sprintf("not ready: %s: %v", device.Reason(src.DeviceError()), src.DeviceError()), http.StatusServiceUnavailable)
	})
	ln, h := agent.Guarded(guard, ln, mux)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "Serving the health endpoints while waiting for the device")
		}
	}()
	return srv
}

// watchPods starts the informers of the pods' IPs and of the
// NetworkPolicies (with namespaces) that vconn dials obey.
func watchPods(ctx context.Context, kube kubernetes.Interface, log logr.Logger) (*rdmanode.PodIPs, *rdmanode.Policies, error) {
	pods, err := rdmanode.NewPodIPs(ctx, kube, log)
	if err != nil {
		return nil, nil, err
	}
	pols, err := rdmanode.NewPolicies(ctx, kube, pods, log)
	if err != nil {
		return nil, nil, err
	}
	return pods, pols, nil
}

// waitPodIPs waits a while for the first list of pods: until it came, no
// pod IP routes (dials retry for a moment, then fail as unreachable); and
// of NetworkPolicies and namespaces, until which pods' dials are refused
// (rdmanode.Policies fails closed).
func waitPodIPs(ctx context.Context, pods *rdmanode.PodIPs, pols *rdmanode.Policies, log logr.Logger) {
	ctx, cancel := context.WithTimeout(ctx, podIPsWait)
	defer cancel()
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced, pols.HasSynced) {
		log.Info("The pods' IPs, NetworkPolicies or namespaces are not listed yet; serving, and dials of pods wait for the IPs and are refused until the policies are listed", "waited", podIPsWait)
	}
}

// podIPsWait bounds waitPodIPs: the API server lists every pod, which on a
// large cluster takes seconds.
const podIPsWait = 30 * time.Second
