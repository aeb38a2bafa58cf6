package metricsauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"net"
	"slices"
	"testing"
	"time"
)

func TestServingCertificate(t *testing.T) {
	f := start(t, newCluster(), Options{Hosts: []string{"node-1.example", "10.0.0.7"}})
	cert := f.srv.Certificate()

	key, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || key.Curve != elliptic.P256() {
		t.Errorf("public key %T, want ECDSA P-256", cert.PublicKey)
	}
	for _, name := range []string{"node-1.example", "localhost"} {
		if !slices.Contains(cert.DNSNames, name) {
			t.Errorf("DNS SANs %v lack %s", cert.DNSNames, name)
		}
	}
	for _, ip := range []string{"10.0.0.7", "127.0.0.1"} {
		if !slices.ContainsFunc(cert.IPAddresses, net.ParseIP(ip).Equal) {
			t.Errorf("IP SANs %v lack %s", cert.IPAddresses, ip)
		}
	}
	if life := cert.NotAfter.Sub(cert.NotBefore); life < 365*24*time.Hour || life > 366*24*time.Hour {
		t.Errorf("valid for %v, want a year", life)
	}
	if err := cert.VerifyHostname("node-1.example"); err != nil {
		t.Errorf("VerifyHostname: %v", err)
	}
}

func TestTLSVersions(t *testing.T) {
	f := start(t, newCluster(), Options{})
	if v := f.g.TLSConfig().MinVersion; v != tls.VersionTLS12 {
		t.Errorf("MinVersion %#x, want TLS 1.2", v)
	}
	if a := f.g.TLSConfig().ClientAuth; a != tls.RequestClientCert {
		t.Errorf("ClientAuth %v, want RequestClientCert", a)
	}
	addr := f.srv.Listener.Addr().String()
	old := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11}
	if conn, err := tls.Dial("tcp", addr, old); err == nil {
		conn.Close()
		t.Error("TLS 1.1 handshake succeeded")
	}
	cur := &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, MaxVersion: tls.VersionTLS12}
	conn, err := tls.Dial("tcp", addr, cur)
	if err != nil {
		t.Fatalf("TLS 1.2 handshake: %v", err)
	}
	conn.Close()
}

func TestTLSConfigIsACopy(t *testing.T) {
	f := start(t, newCluster(), Options{})
	f.g.TLSConfig().MinVersion = tls.VersionTLS10
	if v := f.g.TLSConfig().MinVersion; v != tls.VersionTLS12 {
		t.Errorf("a caller's change reached the Guard: MinVersion %#x", v)
	}
}
