package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
)

// Files are an agent's certificate, key and trust bundle on disk: a
// mounted Secret, which the kubelet replaces in place when the operator
// rotates it.
type Files struct {
	Cert, Key, CA string
}

// recheck bounds how often a handshake looks at the files again.
const recheck = time.Second

// Source hands the files' current contents to TLS handshakes, reloading
// them when they change, so a rotated certificate is used without a
// restart. A change that does not load (a half-written file) keeps the
// last good contents.
type Source struct {
	f Files

	mu      sync.Mutex
	checked time.Time
	stamp   [3]stamp
	cert    *tls.Certificate
	pool    *x509.CertPool
	id      Identity
	err     error // the last reload's
}

type stamp struct {
	mod  time.Time
	size int64
}

// NewSource loads the files; they must hold a node certificate the
// bundle verifies.
func NewSource(f Files) (*Source, error) {
	if f.Cert == "" || f.Key == "" || f.CA == "" {
		return nil, errors.New("pki: certificate, key and CA files are all required")
	}
	s := &Source{f: f}
	if err := s.load(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Source) load() error {
	var st [3]stamp
	for i, p := range []string{s.f.Cert, s.f.Key, s.f.CA} {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("pki: %w", err)
		}
		st[i] = stamp{fi.ModTime(), fi.Size()}
	}
	if s.cert != nil && st == s.stamp {
		return nil
	}
	cert, err := tls.LoadX509KeyPair(s.f.Cert, s.f.Key)
	if err != nil {
		return fmt.Errorf("pki: node certificate: %w", err)
	}
	bundle, err := os.ReadFile(s.f.CA)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	pool, err := Pool(bundle)
	if err != nil {
		return fmt.Errorf("%w (%s)", err, s.f.CA)
	}
	leaf := cert.Leaf
	id, err := IdentityOf(leaf)
	if err != nil {
		return err
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("pki: node certificate %s: %w", s.f.Cert, err)
	}
	s.cert, s.pool, s.id, s.stamp = &cert, pool, id, st
	return nil
}

// current returns the certificate and pool, reloading at most once per
// recheck.
func (s *Source) current() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := time.Now(); now.Sub(s.checked) >= recheck {
		s.checked = now
		s.err = s.load()
	}
	return s.cert, s.pool
}

// Identity is this node's identity, from its current certificate.
func (s *Source) Identity() Identity {
	s.current()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id
}

// Err is the last reload's error: nil while the files load.
func (s *Source) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// ServerConfig requires and verifies a client certificate from the bundle.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := s.current()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{*cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    pool,
			}, nil
		},
	}
}

// ClientConfig presents this node's certificate and verifies the
// server's against the current bundle and serverName, the address dialed:
// the server's certificate must name it. Make one per connection, so a
// rotated bundle is used by the next one.
func (s *Source) ClientConfig(serverName string) *tls.Config {
	_, pool := s.current()
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		ServerName: serverName,
		RootCAs:    pool,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, _ := s.current()
			return cert, nil
		},
	}
}

// VerifyPeer verifies a connection's peer chain against pool, for name (an
// IP or DNS name; empty skips the name check) and usage.
func VerifyPeer(cs tls.ConnectionState, pool *x509.CertPool, name string, usage x509.ExtKeyUsage) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("pki: peer sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, DNSName: name,
		KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return fmt.Errorf("pki: peer certificate: %w", err)
	}
	return nil
}
