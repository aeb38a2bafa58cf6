package pki

import (
	"crypto/tls"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func ips(s ...string) []net.IP {
	var out []net.IP
	for _, a := range s {
		out = append(out, net.ParseIP(a))
	}
	return out
}

func TestIssueAndIdentity(t *testing.T) {
	ca, err := NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	certPEM, keyPEM, err := ca.Issue("node-a", ips("10.0.0.1"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	kp, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	id, err := IdentityOf(kp.Leaf)
	if err != nil {
		t.Fatal(err)
	}
	if id.Node != "node-a" || !id.HasIP(net.ParseIP("10.0.0.1")) || id.HasIP(net.ParseIP("10.0.0.2")) {
		t.Fatalf("identity %+v", id)
	}
	// The IPv4-mapped form is the same address.
	if !id.HasIP(net.ParseIP("::ffff:10.0.0.1")) {
		t.Fatal("mapped address not matched")
	}
	if kp.Leaf.NotAfter.After(ca.Cert.NotAfter) {
		t.Fatal("node certificate outlives its CA")
	}
	if _, _, err := ca.Issue("a/b", nil, time.Hour); err == nil {
		t.Fatal("node name with a slash issued")
	}
}

func TestLoadCA(t *testing.T) {
	ca, _ := NewCA("a", time.Hour)
	other, _ := NewCA("b", time.Hour)
	key, _ := ca.KeyPEM()
	okey, _ := other.KeyPEM()
	if _, err := LoadCA(ca.CertPEM, key); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadCA(ca.CertPEM, okey); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("mismatched key: %v", err)
	}
	if _, err := LoadCA([]byte("junk"), key); err == nil {
		t.Fatal("junk certificate loaded")
	}
	leaf, lkey, _ := ca.Issue("n", nil, time.Hour)
	if _, err := LoadCA(leaf, lkey); err == nil {
		t.Fatal("a node certificate loaded as a CA")
	}
}

func TestSignCSR(t *testing.T) {
	ca, _ := NewCA("a", time.Hour)
	allowed := ips("10.0.0.1", "fd00::1")
	csr, key, err := NewRequest("node-a", ips("10.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.SignCSR(csr, "node-a", allowed, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tls.X509KeyPair(cert, key); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, node string
		ips        []net.IP
		want       string
	}{
		{"another node's name", "node-b", ips("10.0.0.1"), "requester is on"},
		{"another node's address", "node-a", ips("10.0.0.9"), "not one of"},
	} {
		csr, _, err := NewRequest(tc.node, tc.ips)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ca.SignCSR(csr, "node-a", allowed, time.Hour); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := ca.SignCSR([]byte("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n"), "node-a", allowed, time.Hour); err == nil {
		t.Fatal("garbage request signed")
	}
}

// writeNode writes node's certificate, key and ca's bundle into dir.
func writeNode(t *testing.T, dir string, ca *CA, node string, addrs []net.IP) Files {
	t.Helper()
	c, k, err := ca.Issue(node, addrs, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f := Files{Cert: filepath.Join(dir, "tls.crt"), Key: filepath.Join(dir, "tls.key"), CA: filepath.Join(dir, "ca.crt")}
	for p, b := range map[string][]byte{f.Cert: c, f.Key: k, f.CA: ca.CertPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// handshake runs one TLS handshake from client to server over a pipe and
// returns the client's and the server's errors.
func handshake(client, server *tls.Config, serverName string) (cerr, serr error) {
	a, b := net.Pipe()
	c := client.Clone()
	if c.ServerName == "" {
		c.ServerName = serverName
	}
	ch := make(chan error, 1)
	go func() {
		s := tls.Server(b, server)
		err := s.Handshake()
		if err == nil {
			// TLS 1.3 verifies the client after the client's handshake
			// returns: read until the client's close to see the result.
			_, err = s.Read(make([]byte, 1))
			if err != nil && strings.Contains(err.Error(), "EOF") {
				err = nil
			}
		}
		_ = s.Close()
		ch <- err
	}()
	cl := tls.Client(a, c)
	cerr = cl.Handshake()
	_ = cl.Close()
	return cerr, <-ch
}

func TestMutualTLS(t *testing.T) {
	ca, _ := NewCA("cluster", time.Hour)
	rogue, _ := NewCA("rogue", time.Hour)
	srv, err := NewSource(writeNode(t, t.TempDir(), ca, "node-b", ips("10.0.0.2")))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := NewSource(writeNode(t, t.TempDir(), ca, "node-a", ips("10.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	if cerr, serr := handshake(cli.ClientConfig("10.0.0.2"), srv.ServerConfig(), "10.0.0.2"); cerr != nil || serr != nil {
		t.Fatalf("good handshake: client %v, server %v", cerr, serr)
	}
	// The server's certificate must name the address dialed.
	if cerr, _ := handshake(cli.ClientConfig("10.0.0.3"), srv.ServerConfig(), "10.0.0.3"); cerr == nil {
		t.Fatal("server certificate accepted for an address it does not name")
	}
	// A client without a certificate, or with a rogue CA's, is refused.
	bare := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if _, serr := handshake(bare, srv.ServerConfig(), "10.0.0.2"); serr == nil {
		t.Fatal("client without a certificate accepted")
	}
	evil, err := NewSource(writeNode(t, t.TempDir(), rogue, "node-a", ips("10.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	if _, serr := handshake(evil.ClientConfig("10.0.0.2"), srv.ServerConfig(), "10.0.0.2"); serr == nil {
		t.Fatal("client with a rogue CA's certificate accepted")
	}
}

func TestSourceReloadsRotatedFiles(t *testing.T) {
	ca, _ := NewCA("cluster", time.Hour)
	dir := t.TempDir()
	s, err := NewSource(writeNode(t, dir, ca, "node-a", ips("10.0.0.1")))
	if err != nil {
		t.Fatal(err)
	}
	first, _ := s.current()
	// Rotation: new CA, new certificate (with a new address).
	ca2, _ := NewCA("cluster 2", time.Hour)
	f := writeNode(t, dir, ca2, "node-a", ips("10.0.0.7"))
	later := time.Now().Add(2 * time.Second)
	for _, p := range []string{f.Cert, f.Key, f.CA} {
		_ = os.Chtimes(p, later, later)
	}
	s.mu.Lock()
	s.checked = time.Time{}
	s.mu.Unlock()
	second, _ := s.current()
	if first == second || !s.Identity().HasIP(net.ParseIP("10.0.0.7")) || s.Err() != nil {
		t.Fatalf("not reloaded: err %v, identity %+v", s.Err(), s.Identity())
	}
	// A broken file keeps the last good certificate and reports why.
	if err := os.WriteFile(f.Key, []byte("half"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.checked = time.Time{}
	s.mu.Unlock()
	third, _ := s.current()
	if third != second || s.Err() == nil {
		t.Fatalf("broken file: cert changed %v, err %v", third != second, s.Err())
	}
}

func TestNewSourceErrors(t *testing.T) {
	ca, _ := NewCA("cluster", time.Hour)
	other, _ := NewCA("other", time.Hour)
	dir := t.TempDir()
	f := writeNode(t, dir, ca, "node-a", nil)
	if _, err := NewSource(Files{Cert: f.Cert}); err == nil {
		t.Fatal("missing files accepted")
	}
	if err := os.WriteFile(f.CA, other.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := NewSource(f); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("certificate from another CA: %v", err)
	}
}
