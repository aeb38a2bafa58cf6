package metricsauth

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Where the API server publishes the CA it trusts for client
// certificates, for extension API servers and for us.
const (
	caNamespace = "kube-system"
	caConfigMap = "extension-apiserver-authentication"
	caKey       = "client-ca-file"
)

// clientCA is one version of the client CA bundle.
type clientCA struct {
	pool *x509.CertPool
	sum  [sha256.Size]byte // of the PEM, to notice a change
	n    int               // certificates in the bundle
}

// errNoCA says the cluster publishes no usable client CA: client
// certificates are refused until it does.
var errNoCA = errors.New("no client CA")

// refreshLoop re-reads the client CA every period until ctx ends, then
// closes g.done.
func (g *Guard) refreshLoop(ctx context.Context, period time.Duration) {
	defer close(g.done)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			g.refreshCA(ctx)
		}
	}
}

// refreshCA reads the client CA and installs it. An absent or invalid
// bundle removes the current CA (the cluster no longer vouches for it);
// an API error keeps it (a transient failure should not lock kubectl
// users out). A problem is logged once, until it changes.
func (g *Guard) refreshCA(ctx context.Context) {
	g.caMu.Lock()
	defer g.caMu.Unlock()
	ca, err := g.readCA(ctx)
	switch {
	case err == nil:
		g.caProblem = ""
		if old := g.ca.Load(); old == nil || old.sum != ca.sum {
			g.log.Info("client CA loaded", "configMap", caNamespace+"/"+caConfigMap, "certificates", ca.n)
			g.ca.Store(ca)
		}
		return
	case errors.Is(err, errNoCA):
		g.ca.Store(nil)
	}
	msg := err.Error()
	if msg == g.caProblem {
		return
	}
	g.caProblem = msg
	if g.ca.Load() != nil {
		g.log.Error(err, "cannot re-read the client CA, keeping the previous one", "configMap", caNamespace+"/"+caConfigMap)
		return
	}
	g.log.Info("client certificates are not accepted, bearer tokens still are",
		"configMap", caNamespace+"/"+caConfigMap, "reason", msg)
}

// readCA reads and parses the client CA bundle.
func (g *Guard) readCA(ctx context.Context) (*clientCA, error) {
	cm, err := g.kube.CoreV1().ConfigMaps(caNamespace).Get(ctx, caConfigMap, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("%w: ConfigMap %s/%s not found", errNoCA, caNamespace, caConfigMap)
	}
	if err != nil {
		return nil, fmt.Errorf("read ConfigMap %s/%s: %w", caNamespace, caConfigMap, err)
	}
	data, ok := cm.Data[caKey]
	if !ok {
		return nil, fmt.Errorf("%w: ConfigMap %s/%s has no key %q", errNoCA, caNamespace, caConfigMap, caKey)
	}
	ca, err := parseCA([]byte(data))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", errNoCA, caKey, err)
	}
	return ca, nil
}

// parseCA parses a PEM bundle; it must hold at least one certificate,
// and every CERTIFICATE block must parse.
func parseCA(data []byte) (*clientCA, error) {
	ca := &clientCA{pool: x509.NewCertPool(), sum: sha256.Sum256(data)}
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", ca.n+1, err)
		}
		ca.pool.AddCert(c)
		ca.n++
	}
	if ca.n == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return ca, nil
}
