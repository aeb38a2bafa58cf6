// Package nodecert keeps a node agent's certificate fresh: it asks the
// operator's signer for one with a CertificateSigningRequest made with the
// pod's service account token (which tells the API server, and so the
// signer, the pod's node), writes it next to its key, and renews it at two
// thirds of its life. The agent's TLS source picks new files up by itself.
package nodecert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/go-logr/logr"
	certificatesv1 "k8s.io/api/certificates/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/internal/atomicfile"
	"github.com/rdmavisor/rdmavisor/internal/pki"
)

// SignerName is the operator's signer (controllers.SignerName).
const SignerName = "rdmavisor.io/agent"

// Keeper keeps CertFile and KeyFile holding a valid certificate of Node.
type Keeper struct {
	Client client.Client
	Node   string
	IPs    []net.IP
	// CertFile and KeyFile are written (atomically, by rename); their
	// directory must exist and be the agent's alone.
	CertFile, KeyFile string
	// TTL asked for (the signer may give less; at least 10 minutes).
	TTL time.Duration
	// Poll is how often a pending request is checked (default 500ms).
	Poll time.Duration
	Log  logr.Logger

	// mu makes Run's renewals and Renew's one at a time.
	mu sync.Mutex
}

// ErrDenied is returned when the signer refused the request.
var ErrDenied = errors.New("nodecert: certificate request denied")

// Ensure requests a certificate unless the files hold one with more than
// a third of its life left, and returns when they do.
func (k *Keeper) Ensure(ctx context.Context) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if renew := k.renewAt(); renew.After(time.Now()) {
		return nil
	}
	return k.request(ctx)
}

// Renew replaces the certificate now, whatever life it has left: after a
// CA rotation, or to prove that rotation under traffic loses nothing. It
// returns the new certificate. The agent's TLS reloads the files on the
// next handshake; established connections keep their session.
func (k *Keeper) Renew(ctx context.Context) (*x509.Certificate, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.request(ctx); err != nil {
		return nil, err
	}
	kp, err := tls.LoadX509KeyPair(k.CertFile, k.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("nodecert: the renewed certificate: %w", err)
	}
	return kp.Leaf, nil
}

// request asks the signer for a certificate and installs it; with k.mu held.
func (k *Keeper) request(ctx context.Context) error {
	csrPEM, keyPEM, err := pki.NewRequest(k.Node, k.IPs)
	if err != nil {
		return err
	}
	ttl := max(k.TTL, 10*time.Minute)
	csr := &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "rdmavisor-" + k.Node + "-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request: csrPEM, SignerName: SignerName, ExpirationSeconds: ptr(int32(ttl / time.Second)),
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth,
				certificatesv1.UsageServerAuth},
		},
	}
	if err := k.Client.Create(ctx, csr); err != nil {
		return fmt.Errorf("nodecert: requesting a certificate for %s: %w", k.Node, err)
	}
	k.Log.Info("Requested a node certificate", "csr", csr.Name, "addresses", k.IPs)
	cert, err := k.wait(ctx, csr)
	if err != nil {
		return err
	}
	if _, err := tls.X509KeyPair(cert, keyPEM); err != nil {
		return fmt.Errorf("nodecert: signed certificate of %s: %w", csr.Name, err)
	}
	// The key first: a reader that sees the new certificate then finds
	// its key (a reader between the two renames fails to load the pair
	// and keeps its last good one).
	if err := atomicfile.Write(k.KeyFile, keyPEM, 0o600); err != nil {
		return fmt.Errorf("nodecert: %w", err)
	}
	if err := atomicfile.Write(k.CertFile, cert, 0o600); err != nil {
		return fmt.Errorf("nodecert: %w", err)
	}
	k.Log.Info("Installed a node certificate", "csr", csr.Name, "renewAt", k.renewAt())
	return nil
}

func (k *Keeper) wait(ctx context.Context, csr *certificatesv1.CertificateSigningRequest) ([]byte, error) {
	poll := k.Poll
	if poll <= 0 {
		poll = 500 * time.Millisecond
	}
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("nodecert: waiting for %s to be signed: %w", csr.Name, ctx.Err())
		case <-t.C:
		}
		if err := k.Client.Get(ctx, client.ObjectKeyFromObject(csr), csr); err != nil {
			return nil, fmt.Errorf("nodecert: %s: %w", csr.Name, err)
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateDenied || c.Type == certificatesv1.CertificateFailed {
				return nil, fmt.Errorf("%w: %s: %s: %s", ErrDenied, csr.Name, c.Reason, c.Message)
			}
		}
		if len(csr.Status.Certificate) > 0 {
			return csr.Status.Certificate, nil
		}
	}
}

// renewAt is when the current files' certificate is two thirds through
// its life; the zero time when there is none (or it does not load).
func (k *Keeper) renewAt() time.Time {
	kp, err := tls.LoadX509KeyPair(k.CertFile, k.KeyFile)
	if err != nil || kp.Leaf == nil {
		return time.Time{}
	}
	id, err := pki.IdentityOf(kp.Leaf)
	if err != nil || id.Node != k.Node {
		return time.Time{}
	}
	for _, ip := range k.IPs {
		if !id.HasIP(ip) {
			return time.Time{} // the node's addresses changed
		}
	}
	life := kp.Leaf.NotAfter.Sub(kp.Leaf.NotBefore)
	return kp.Leaf.NotBefore.Add(life * 2 / 3)
}

// Run renews the certificate until ctx ends, retrying failures with
// backoff (up to a minute).
func (k *Keeper) Run(ctx context.Context) {
	backoff := time.Second
	for {
		wait := time.Until(k.renewAt())
		if wait <= 0 {
			if err := k.Ensure(ctx); err != nil {
				if ctx.Err() != nil {
					return
				}
				k.Log.Error(err, "Cannot renew the node certificate", "retryIn", backoff)
				wait, backoff = backoff, min(2*backoff, time.Minute)
			} else {
				wait, backoff = time.Until(k.renewAt()), time.Second
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Second)):
		}
	}
}

func ptr[T any](v T) *T { return &v }
