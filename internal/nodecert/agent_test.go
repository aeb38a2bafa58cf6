package nodecert_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/nodecert"
	"github.com/rdmavisor/rdmavisor/internal/pki"
)

// signer answers every Get of a pending request as the operator would:
// it signs for node with addresses, or denies.
type signer struct {
	ca        *pki.CA
	node      string
	addresses []net.IP
	never     bool // leave requests pending
	requests  int
}

func (s *signer) client(t *testing.T) client.Client {
	t.Helper()
	sch := k8sruntime.NewScheme()
	if err := certificatesv1.AddToScheme(sch); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(sch).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
			s.requests++
			return c.Create(ctx, o, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, o client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, o, opts...); err != nil {
				return err
			}
			csr, ok := o.(*certificatesv1.CertificateSigningRequest)
			if !ok || s.never || len(csr.Status.Certificate) > 0 || len(csr.Status.Conditions) > 0 {
				return nil
			}
			if csr.Spec.SignerName != nodecert.SignerName {
				t.Errorf("request %s asks signer %q", csr.Name, csr.Spec.SignerName)
			}
			cert, err := s.ca.SignCSR(csr.Spec.Request, s.node, s.addresses, time.Hour)
			if err != nil {
				csr.Status.Conditions = []certificatesv1.CertificateSigningRequestCondition{{
					Type: certificatesv1.CertificateDenied, Status: "True", Reason: "BadRequest", Message: err.Error(),
					LastUpdateTime: metav1.Now()}}
			} else {
				csr.Status.Certificate = cert
			}
			return c.Status().Update(ctx, csr)
		},
	}).Build()
}

func newCA(t *testing.T) *pki.CA {
	t.Helper()
	ca, err := pki.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func agentConfig(t *testing.T, mode config.DiscoveryMode) *config.AgentConfig {
	t.Helper()
	dir := t.TempDir()
	cfg := config.Default()
	cfg.NodeName = "node-a"
	cfg.Soft.BindAddress = "10.0.0.1"
	cfg.PeerDiscovery.Mode = mode
	cfg.TLS = config.TLSConfig{CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"),
		CAFile: filepath.Join(dir, "ca.crt")}
	return cfg
}

func TestBootstrapRequests(t *testing.T) {
	s := &signer{ca: newCA(t), node: "node-a", addresses: []net.IP{net.ParseIP("10.0.0.1"), net.ParseIP("192.0.2.1")}}
	c := s.client(t)
	cfg := agentConfig(t, config.DiscoveryKubernetes)
	k, err := nodecert.Bootstrap(t.Context(), cfg, c, 5*time.Second, logr.Discard())
	if err != nil || k == nil {
		t.Fatalf("Bootstrap = %v, %v; want a keeper", k, err)
	}
	kp, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	id, err := pki.IdentityOf(kp.Leaf)
	if err != nil || id.Node != "node-a" || !id.HasIP(net.ParseIP("10.0.0.1")) || id.HasIP(net.ParseIP("192.0.2.1")) {
		t.Fatalf("certificate of %+v (%v): want node-a for 10.0.0.1 only, the address the agent binds", id, err)
	}
	// A valid certificate is kept: a restarted agent asks for none.
	if _, err := nodecert.Bootstrap(t.Context(), cfg, c, 5*time.Second, logr.Discard()); err != nil || s.requests != 1 {
		t.Fatalf("second Bootstrap: %v, %d requests in all; want 1", err, s.requests)
	}
}

func TestBootstrapFails(t *testing.T) {
	for _, tc := range []struct {
		name   string
		signer signer
		mutate func(*config.AgentConfig)
		is     error
		want   string
	}{
		{name: "address not the node's", signer: signer{node: "node-a", addresses: []net.IP{net.ParseIP("10.9.9.9")}},
			is: nodecert.ErrDenied, want: "InternalIP"},
		{name: "never signed", signer: signer{never: true}, is: context.DeadlineExceeded, want: "is the operator running"},
		{name: "no node IP", mutate: func(c *config.AgentConfig) { c.Soft.BindAddress = "" }, want: "NODE_IP"},
		{name: "unspecified node IP", mutate: func(c *config.AgentConfig) { c.Soft.BindAddress = "0.0.0.0" }, want: "NODE_IP"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.signer.ca = newCA(t)
			cfg := agentConfig(t, config.DiscoveryKubernetes)
			if tc.mutate != nil {
				tc.mutate(cfg)
			}
			k, err := nodecert.Bootstrap(t.Context(), cfg, tc.signer.client(t), 2*time.Second, logr.Discard())
			if k != nil || err == nil || (tc.is != nil && !errors.Is(err, tc.is)) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Bootstrap = %v, %v; want an error (%v) saying %q", k, err, tc.is, tc.want)
			}
			if _, err := os.Stat(cfg.TLS.CertFile); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("certificate file after a failure: %v", err)
			}
		})
	}
}

func TestBootstrapWithoutRequest(t *testing.T) {
	t.Run("no TLS", func(t *testing.T) {
		cfg := agentConfig(t, config.DiscoveryKubernetes)
		cfg.TLS = config.TLSConfig{}
		if k, err := nodecert.Bootstrap(t.Context(), cfg, nil, time.Second, logr.Discard()); k != nil || err != nil {
			t.Fatalf("Bootstrap = %v, %v; want nothing to do", k, err)
		}
	})
	t.Run("static, files missing", func(t *testing.T) {
		cfg := agentConfig(t, config.DiscoveryStatic)
		k, err := nodecert.Bootstrap(t.Context(), cfg, nil, time.Second, logr.Discard())
		if k != nil || err == nil || !strings.Contains(err.Error(), "tls.certFile") || !strings.Contains(err.Error(), "tls.caFile") {
			t.Fatalf("Bootstrap = %v, %v; want the missing files named", k, err)
		}
	})
	t.Run("static, files present", func(t *testing.T) {
		cfg := agentConfig(t, config.DiscoveryStatic)
		ca := newCA(t)
		cert, key, err := ca.Issue("node-a", []net.IP{net.ParseIP("10.0.0.1")}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		for path, data := range map[string][]byte{cfg.TLS.CertFile: cert, cfg.TLS.KeyFile: key, cfg.TLS.CAFile: ca.CertPEM} {
			if err := os.WriteFile(path, data, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		if k, err := nodecert.Bootstrap(t.Context(), cfg, nil, time.Second, logr.Discard()); k != nil || err != nil {
			t.Fatalf("Bootstrap = %v, %v; want the files used as they are", k, err)
		}
	})
}

func TestNeeded(t *testing.T) {
	for _, tc := range []struct {
		mode config.DiscoveryMode
		tls  bool
		want bool
	}{
		{config.DiscoveryKubernetes, true, true},
		{config.DiscoveryKubernetes, false, false},
		{config.DiscoveryStatic, true, false},
	} {
		cfg := agentConfig(t, tc.mode)
		if !tc.tls {
			cfg.TLS = config.TLSConfig{}
		}
		if got := nodecert.Needed(cfg); got != tc.want {
			t.Errorf("Needed(%s, tls %v) = %v, want %v", tc.mode, tc.tls, got, tc.want)
		}
	}
}

// TestRenew: Renew replaces a certificate that has most of its life left,
// with a new serial and key, while Ensure would keep it.
func TestRenew(t *testing.T) {
	s := &signer{ca: newCA(t), node: "node-a", addresses: []net.IP{net.ParseIP("10.0.0.1")}}
	cfg := agentConfig(t, config.DiscoveryKubernetes)
	k, err := nodecert.Bootstrap(t.Context(), cfg, s.client(t), 5*time.Second, logr.Discard())
	if err != nil || k == nil {
		t.Fatalf("Bootstrap = %v, %v", k, err)
	}
	old, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Ensure(t.Context()); err != nil || s.requests != 1 {
		t.Fatalf("Ensure of a fresh certificate: %v, %d requests; want none made", err, s.requests)
	}
	cert, err := k.Renew(t.Context())
	if err != nil || s.requests != 2 {
		t.Fatalf("Renew: %v, %d requests; want a second", err, s.requests)
	}
	now, err := tls.LoadX509KeyPair(cfg.TLS.CertFile, cfg.TLS.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	if now.Leaf.SerialNumber.Cmp(old.Leaf.SerialNumber) == 0 || cert.SerialNumber.Cmp(now.Leaf.SerialNumber) != 0 {
		t.Fatalf("serials: old %v, installed %v, returned %v", old.Leaf.SerialNumber, now.Leaf.SerialNumber, cert.SerialNumber)
	}
	if id, err := pki.IdentityOf(now.Leaf); err != nil || id.Node != "node-a" {
		t.Fatalf("renewed certificate of %+v (%v)", id, err)
	}
}
