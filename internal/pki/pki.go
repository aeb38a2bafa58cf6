// Package pki issues and checks the certificates node agents present to
// each other: a cluster CA signs one certificate per node, naming the node
// (a URI SAN rdmavisor://node/NAME) and its addresses (IP SANs). A peer's
// certificate then proves which node it is and which addresses, and so
// which RoCE v2 GIDs, it may claim.
package pki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// uriScheme and uriHost make a node's URI SAN: rdmavisor://node/NAME.
const (
	uriScheme = "rdmavisor"
	uriHost   = "node"
)

// Identity is what a node certificate vouches for.
type Identity struct {
	Node string
	IPs  []net.IP
}

// HasIP reports whether ip is one of the identity's addresses.
func (id Identity) HasIP(ip net.IP) bool {
	return slices.ContainsFunc(id.IPs, ip.Equal)
}

// NodeURI is the URI SAN naming node.
func NodeURI(node string) *url.URL {
	return &url.URL{Scheme: uriScheme, Host: uriHost, Path: "/" + node}
}

// IdentityOf reads the identity of a node certificate: exactly one node
// URI SAN, and its IP SANs.
func IdentityOf(c *x509.Certificate) (Identity, error) {
	var id Identity
	for _, u := range c.URIs {
		if u.Scheme != uriScheme || u.Host != uriHost {
			continue
		}
		name := strings.TrimPrefix(u.Path, "/")
		if name == "" || strings.Contains(name, "/") {
			return Identity{}, fmt.Errorf("pki: bad node URI %q", u)
		}
		if id.Node != "" {
			return Identity{}, errors.New("pki: certificate names two nodes")
		}
		id.Node = name
	}
	if id.Node == "" {
		return Identity{}, fmt.Errorf("pki: certificate %q names no node", c.Subject.CommonName)
	}
	id.IPs = c.IPAddresses
	return id, nil
}

// CA is a cluster certificate authority.
type CA struct {
	Cert *x509.Certificate
	Key  crypto.Signer
	// CertPEM is Cert, PEM encoded: the trust bundle agents load.
	CertPEM []byte
}

// NewCA makes a self-signed CA valid for ttl.
func NewCA(name string, ttl time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(ttl),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	return caFrom(der, key)
}

func caFrom(der []byte, key crypto.Signer) (*CA, error) {
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: CA certificate: %w", err)
	}
	return &CA{Cert: c, Key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// LoadCA reads a CA from PEM (as stored in a Secret).
func LoadCA(certPEM, keyPEM []byte) (*CA, error) {
	b, _ := pem.Decode(certPEM)
	if b == nil || b.Type != "CERTIFICATE" {
		return nil, errors.New("pki: CA certificate is not PEM")
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	ca, err := caFrom(b.Bytes, key)
	if err != nil {
		return nil, err
	}
	if !ca.Cert.IsCA {
		return nil, errors.New("pki: CA certificate is not a CA")
	}
	pub, ok := ca.Cert.PublicKey.(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("pki: CA key does not match its certificate")
	}
	return ca, nil
}

// KeyPEM encodes the CA's key.
func (ca *CA) KeyPEM() ([]byte, error) { return keyPEM(ca.Key) }

// Issue makes a key and a certificate for node with addresses ips, valid
// for ttl. Both are PEM encoded.
func (ca *CA) Issue(node string, ips []net.IP, ttl time.Duration) (certPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: node key: %w", err)
	}
	certPEM, err = ca.sign(key.Public(), node, ips, ttl)
	if err != nil {
		return nil, nil, err
	}
	kp, err := keyPEM(key)
	return certPEM, kp, err
}

// SignCSR signs a certificate request for node. The request must name
// exactly node and a subset of allowed (the node's addresses as the
// signer knows them): a requester cannot get another node's name or
// addresses into its certificate.
func (ca *CA) SignCSR(csrPEM []byte, node string, allowed []net.IP, ttl time.Duration) ([]byte, error) {
	b, _ := pem.Decode(csrPEM)
	if b == nil || b.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("pki: request is not a PEM certificate request")
	}
	csr, err := x509.ParseCertificateRequest(b.Bytes)
	if err != nil {
		return nil, fmt.Errorf("pki: request: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("pki: request signature: %w", err)
	}
	id, err := IdentityOf(&x509.Certificate{URIs: csr.URIs, IPAddresses: csr.IPAddresses, Subject: csr.Subject})
	if err != nil {
		return nil, err
	}
	if id.Node != node {
		return nil, fmt.Errorf("pki: request names node %q, requester is on %q", id.Node, node)
	}
	if len(csr.DNSNames)+len(csr.EmailAddresses) != 0 || len(csr.URIs) != 1 {
		return nil, errors.New("pki: request has names other than its node and addresses")
	}
	for _, ip := range id.IPs {
		if !slices.ContainsFunc(allowed, ip.Equal) {
			return nil, fmt.Errorf("pki: request names address %s, not one of node %s's", ip, node)
		}
	}
	return ca.sign(csr.PublicKey, node, id.IPs, ttl)
}

func (ca *CA) sign(pub crypto.PublicKey, node string, ips []net.IP, ttl time.Duration) ([]byte, error) {
	if node == "" || strings.Contains(node, "/") {
		return nil, fmt.Errorf("pki: bad node name %q", node)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: node},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		// Every agent is both a gRPC server and a client of its peers.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		URIs:        []*url.URL{NodeURI(node)},
		IPAddresses: ips,
	}
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("pki: node certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// NewRequest makes a key and a certificate request for node and ips,
// both PEM encoded: what an agent sends to the operator's signer.
func NewRequest(node string, ips []net.IP) (csrPEM, keyPEMBytes []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: node key: %w", err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: node}, URIs: []*url.URL{NodeURI(node)}, IPAddresses: ips}, key)
	if err != nil {
		return nil, nil, fmt.Errorf("pki: request: %w", err)
	}
	kp, err := keyPEM(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), kp, err
}

func keyPEM(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("pki: key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func parseKey(p []byte) (crypto.Signer, error) {
	b, _ := pem.Decode(p)
	if b == nil {
		return nil, errors.New("pki: key is not PEM")
	}
	var k any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("pki: key of PEM type %q", b.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("pki: key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, errors.New("pki: key cannot sign")
	}
	return s, nil
}

// Pool parses a PEM bundle of CA certificates.
func Pool(bundle []byte) (*x509.CertPool, error) {
	p := x509.NewCertPool()
	if !p.AppendCertsFromPEM(bundle) {
		return nil, errors.New("pki: no CA certificate in the bundle")
	}
	return p, nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("pki: no randomness: %v", err)) // crypto/rand does not fail on Linux
	}
	return n
}
