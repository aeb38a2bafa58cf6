package nodecert

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// DefaultTTL is the life an agent asks its certificate for (the signer's
// cap, controllers.NodeCertTTL): renewed at two thirds, 16 hours.
const DefaultTTL = 24 * time.Hour

// DefaultBootstrapTimeout bounds the first request (the signer answers
// in about a second). It is under the 20 seconds after which the
// kubelet's liveness probe (from the container's start, every 10s, three
// failures) restarts an agent that serves no /healthz yet: the agent
// exits first, with the reason in its log.
const DefaultBootstrapTimeout = 15 * time.Second

// NewClient returns a client of the API server (in cluster: the pod's
// service account) that knows certificate requests.
func NewClient() (client.Client, error) {
	rc, err := ctrlconfig.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("nodecert: API server config: %w", err)
	}
	s := k8sruntime.NewScheme()
	if err := certificatesv1.AddToScheme(s); err != nil {
		return nil, err
	}
	c, err := client.New(rc, client.Options{Scheme: s})
	if err != nil {
		return nil, fmt.Errorf("nodecert: API client: %w", err)
	}
	return c, nil
}

// Needed reports whether the agent configured by cfg requests its own
// certificate: with TLS and Kubernetes discovery. With static discovery
// the files are provisioned by whoever runs the agent.
func Needed(cfg *config.AgentConfig) bool {
	return cfg.TLS.Enabled() && cfg.PeerDiscovery.Mode == config.DiscoveryKubernetes
}

// Bootstrap makes the TLS files of the agent configured by cfg ready
// before the agent starts, and returns the Keeper to Run for renewals:
// nil without TLS, and in static discovery mode, where it only checks
// that the files exist (nothing requests them there). With Kubernetes
// discovery it requests a certificate of cfg's node for the address the
// agent binds (soft.bindAddress, the node IP), which peers check the
// agent's claims against, through c, waiting at most timeout for the
// signer.
func Bootstrap(ctx context.Context, cfg *config.AgentConfig, c client.Client, timeout time.Duration, log logr.Logger) (*Keeper, error) {
	t := cfg.TLS
	if !t.Enabled() {
		return nil, nil
	}
	if !Needed(cfg) {
		var errs []error
		for _, f := range []struct{ name, path string }{{"certFile", t.CertFile}, {"keyFile", t.KeyFile}, {"caFile", t.CAFile}} {
			if _, err := os.Stat(f.path); err != nil {
				errs = append(errs, fmt.Errorf("tls.%s: %w", f.name, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, fmt.Errorf("nodecert: with %s peer discovery the agent requests no certificate, its files must exist: %w",
				cfg.PeerDiscovery.Mode, err)
		}
		return nil, nil
	}
	if c == nil {
		return nil, errors.New("nodecert: no API client to request the node certificate with")
	}
	ip := net.ParseIP(cfg.Soft.BindAddress)
	if ip == nil || ip.IsUnspecified() {
		return nil, fmt.Errorf("nodecert: the node certificate needs the node IP (--node-ip or NODE_IP), got %q", cfg.Soft.BindAddress)
	}
	k := &Keeper{Client: c, Node: cfg.NodeName, IPs: []net.IP{ip}, CertFile: t.CertFile, KeyFile: t.KeyFile,
		TTL: DefaultTTL, Log: log.WithName("nodecert")}
	log.Info("Getting the node certificate from the operator's signer", "node", k.Node, "address", ip,
		"signer", SignerName, "timeout", timeout)
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := k.Ensure(wctx); err != nil {
		switch {
		case errors.Is(err, ErrDenied):
			err = fmt.Errorf("%w (the signer certifies an agent of the operator's service accounts only for its Node's InternalIP and ExternalIP addresses; this agent binds %s)", err, ip)
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			err = fmt.Errorf("%w (no signature within %s: is the operator running?)", err, timeout)
		}
		return nil, err
	}
	log.Info("The node certificate is ready", "certFile", k.CertFile, "renewAt", k.renewAt())
	return k, nil
}
