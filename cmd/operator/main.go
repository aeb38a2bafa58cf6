// Command operator runs the RDMAvisor operator: it reconciles RDMAServices
// into node agent DaemonSets and reports the agents' RDMANodes in their status.
// This file only parses flags and wires the manager; the logic is in
// package controllers.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/rdmavisor/rdmavisor/api/v1alpha1"
	"github.com/rdmavisor/rdmavisor/controllers"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "operator:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		metricsAddr, probeAddr, namespace, image string
		leaderElect, metricsSecure               bool
	)
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "Address of the metrics endpoint; 0 disables it.")
	flag.BoolVar(&metricsSecure, "metrics-secure", true,
		"Serve metrics over HTTPS to clients the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the /metrics non-resource URL).")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	flag.BoolVar(&leaderElect, "leader-elect", true, "Elect a leader, so that only one replica reconciles.")
	flag.StringVar(&namespace, "namespace", envOr("POD_NAMESPACE", "rdmavisor-system"),
		"Namespace of the agent DaemonSets, ConfigMaps and ServiceAccounts, and of the leader election lease.")
	flag.StringVar(&image, "agent-image", "ghcr.io/rdmavisor/rdmavisor:latest", "Agent image of RDMAServices that set none.")
	zapOpts := zap.Options{}
	zapOpts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zapOpts)))

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("loading kubeconfig: %w", err)
	}
	metrics := metricsserver.Options{BindAddress: metricsAddr}
	if metricsSecure {
		// A self-signed certificate unless one is mounted in CertDir;
		// HTTP/1.1 only, as HTTP/2's stream handling had denial-of-service
		// flaws (CVE-2023-44487, CVE-2023-39325) the scaffold also avoids.
		metrics.SecureServing = true
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
		metrics.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Cache:                   controllers.CacheOptions(namespace),
		Metrics:                 metrics,
		HealthProbeBindAddress:  probeAddr,
		LeaderElection:          leaderElect,
		LeaderElectionID:        "operator.rdmavisor.io",
		LeaderElectionNamespace: namespace,
		// The process exits right after the manager stops, so giving the
		// lease up at once lets a standby take over without waiting it out.
		LeaderElectionReleaseOnCancel: true,
	})
	if err != nil {
		return fmt.Errorf("creating manager: %w", err)
	}
	ctx := ctrl.SetupSignalHandler()
	rec := controllers.New(mgr.GetClient(), namespace, image)
	rec.Recorder = mgr.GetEventRecorder(controllers.EventSource)
	if err := rec.SetupWithManager(ctx, mgr); err != nil {
		return fmt.Errorf("setting up the RDMAService controller: %w", err)
	}
	signer := &controllers.CertSigner{Client: mgr.GetClient(), API: mgr.GetAPIReader(), Namespace: namespace}
	if err := signer.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the certificate signer: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	ctrl.Log.WithName("setup").Info("Starting the manager", "namespace", namespace)
	if err := mgr.Start(ctx); err != nil {
		return fmt.Errorf("running manager: %w", err)
	}
	return nil
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
