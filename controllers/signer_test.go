package controllers

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/rdmavisor/rdmavisor/controllers/testenv"
	"github.com/rdmavisor/rdmavisor/internal/nodecert"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/internal/poll"
)

// TestCertSigner: an agent's request for its own node's certificate is
// approved and signed by the cluster CA; requests for another node, for an
// address the node lacks, without a pod-bound token or from a service
// account that is not an agent's are denied.
func TestCertSigner(t *testing.T) {
	ctx := testCtx(t)
	const svc = "signer"
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "rdmavisor-agent-" + svc,
		Labels: map[string]string{labelManagedBy: FieldOwner, LabelService: svc}}}
	plain := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "rdmavisor-agent-plain"}}
	// Both may create requests: the signer, not RBAC, must tell them apart.
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "signer-test-csr"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "signer-test-csr"},
		RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: testNamespace, Name: sa.Name},
			{Kind: "ServiceAccount", Namespace: testNamespace, Name: plain.Name}}}
	for _, o := range []client.Object{sa, plain, role, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(ctx, o) })
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "signer-node"}}
	createNode(t, node)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.1.0.5"},
		{Type: corev1.NodeHostName, Address: "signer-node"}}
	if err := k8s.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}

	agent := agentClient(t, svc, "signer-node")
	cert, denied := certVerdict(t, requestCert(t, agent, "signer-node", "10.1.0.5"))
	if denied != "" {
		t.Fatalf("the agent's own request was denied: %s", denied)
	}
	sec := &corev1.Secret{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: CAName}, sec); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: CAName}, cm); err != nil {
		t.Fatal(err)
	}
	if cm.Data[CABundleKey] != string(sec.Data[corev1.TLSCertKey]) {
		t.Fatal("the published bundle is not the CA's certificate")
	}
	pool, err := pki.Pool([]byte(cm.Data[CABundleKey]))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(cert)
	leaf, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("certificate does not verify: %v", err)
	}
	id, err := pki.IdentityOf(leaf)
	if err != nil || id.Node != "signer-node" || !id.HasIP(net.ParseIP("10.1.0.5")) {
		t.Fatalf("identity %+v, %v", id, err)
	}
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > 3600e9+120e9 {
		t.Errorf("certificate lives %v, asked for 1h", life)
	}

	for _, tc := range []struct {
		name string
		c    client.Client
		node string
		ips  []string
		want string
	}{
		{"another node's name", agent, "other-node", []string{"10.1.0.5"}, "requester is on"},
		{"an address the node lacks", agent, "signer-node", []string{"10.1.0.6"}, "not one of"},
		{"a token not bound to a pod", agentClient(t, svc, ""), "signer-node", []string{"10.1.0.5"}, "no node name"},
		{"a service account not rendered", saClient(t, plain.Name, "signer-node"), "signer-node", []string{"10.1.0.5"}, "not an agent's"},
	} {
		cert, denied := certVerdict(t, requestCert(t, tc.c, tc.node, tc.ips...))
		if len(cert) > 0 || !strings.Contains(denied, tc.want) {
			t.Errorf("%s: certificate %v, denied %q, want denied with %q", tc.name, len(cert) > 0, denied, tc.want)
		}
	}
}

// requestCert creates, as c, a request to the signer for a certificate of
// node and ips, deleted when the test ends.
func requestCert(t *testing.T, c client.Client, node string, ips ...string) *certificatesv1.CertificateSigningRequest {
	t.Helper()
	var addrs []net.IP
	for _, a := range ips {
		addrs = append(addrs, net.ParseIP(a))
	}
	der, _, err := pki.NewRequest(node, addrs)
	if err != nil {
		t.Fatal(err)
	}
	csr := &certificatesv1.CertificateSigningRequest{ObjectMeta: metav1.ObjectMeta{GenerateName: "signer-test-"},
		Spec: certificatesv1.CertificateSigningRequestSpec{Request: der, SignerName: SignerName,
			ExpirationSeconds: ptr[int32](3600),
			Usages: []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth,
				certificatesv1.UsageServerAuth}}}
	if err := c.Create(testCtx(t), csr); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = k8s.Delete(context.Background(), csr) })
	return csr
}

// certVerdict waits for the signer's verdict on csr: the certificate, or
// the denial's message.
func certVerdict(t *testing.T, csr *certificatesv1.CertificateSigningRequest) (cert []byte, denied string) {
	t.Helper()
	poll.UntilNil(t, 30*time.Second, "a verdict on "+csr.Name, func() error {
		if err := k8s.Get(testCtx(t), client.ObjectKeyFromObject(csr), csr); err != nil {
			return err
		}
		for _, c := range csr.Status.Conditions {
			if c.Type == certificatesv1.CertificateDenied {
				denied = c.Message
				return nil
			}
		}
		if cert = csr.Status.Certificate; len(cert) == 0 {
			return errors.New("no certificate yet")
		}
		return nil
	})
	return cert, denied
}

// saClient acts as service account name of the test namespace, from a pod
// on node.
func saClient(t *testing.T, name, node string) client.Client {
	t.Helper()
	cfg := rest.CopyConfig(restCfg)
	cfg.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + testNamespace + ":" + name,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + testNamespace, "system:authenticated"},
		Extra:    map[string][]string{nodeNameExtra: {node}},
	}
	c, err := client.New(cfg, client.Options{Scheme: testenv.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestAgentEnrolls: an agent's nodecert.Keeper gets its node's certificate
// from the operator's signer, and the files it writes make a TLS source
// with the published bundle; a keeper asking for another node's is denied.
func TestAgentEnrolls(t *testing.T) {
	if nodecert.SignerName != SignerName {
		t.Fatalf("agents ask signer %q, the operator is %q", nodecert.SignerName, SignerName)
	}
	ctx := testCtx(t)
	const svc = "enroll"
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "rdmavisor-agent-" + svc,
		Labels: map[string]string{labelManagedBy: FieldOwner, LabelService: svc}}}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "enroll-test-csr"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "enroll-test-csr"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: testNamespace, Name: sa.Name}}}
	for _, o := range []client.Object{sa, role, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(ctx, o) })
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "enroll-node"}}
	createNode(t, node)
	node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.1.0.8"}}
	if err := k8s.Status().Update(ctx, node); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	k := &nodecert.Keeper{Client: agentClient(t, svc, "enroll-node"), Node: "enroll-node", IPs: []net.IP{net.ParseIP("10.1.0.8")},
		CertFile: filepath.Join(dir, "tls.crt"), KeyFile: filepath.Join(dir, "tls.key"), TTL: time.Hour, Poll: 100 * time.Millisecond}
	if err := k.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	cm := &corev1.ConfigMap{}
	if err := k8s.Get(ctx, client.ObjectKey{Namespace: testNamespace, Name: CAName}, cm); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, []byte(cm.Data[CABundleKey]), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := pki.NewSource(pki.Files{Cert: k.CertFile, Key: k.KeyFile, CA: caFile})
	if err != nil {
		t.Fatal(err)
	}
	if id := src.Identity(); id.Node != "enroll-node" {
		t.Fatalf("identity %+v", id)
	}
	// Valid for more than a third of its life: no new request.
	before, _ := os.ReadFile(k.CertFile)
	if err := k.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(k.CertFile); string(after) != string(before) {
		t.Fatal("a fresh certificate was replaced")
	}

	other := &nodecert.Keeper{Client: k.Client, Node: "some-other-node", IPs: k.IPs, TTL: k.TTL, Poll: k.Poll, Log: k.Log,
		CertFile: filepath.Join(dir, "o.crt"), KeyFile: filepath.Join(dir, "o.key")}
	if err := other.Ensure(ctx); !errors.Is(err, nodecert.ErrDenied) {
		t.Fatalf("another node's certificate: %v, want ErrDenied", err)
	}
	if _, err := os.Stat(other.CertFile); !os.IsNotExist(err) {
		t.Fatalf("a denied request left a certificate file: %v", err)
	}
}

// TestSignerRefusesSharedAddress: a kubelet writes its own Node's
// addresses, so a node can claim another's IP. The signer certifies an
// address only while no other node has it: once node B claims node A's IP,
// B's request for it is denied (certificates naming A's IP signed for B: 0),
// and so is A's renewal (the signer cannot tell which node tells the
// truth); when B gives the address up, A's request is signed again.
func TestSignerRefusesSharedAddress(t *testing.T) {
	ctx := testCtx(t)
	const svc, ip = "shared", "10.1.2.5"
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: testNamespace, Name: "rdmavisor-agent-" + svc,
		Labels: map[string]string{labelManagedBy: FieldOwner, LabelService: svc}}}
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "shared-test-csr"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{"certificates.k8s.io"}, Resources: []string{"certificatesigningrequests"},
			Verbs: []string{"create", "get"}}}}
	binding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "shared-test-csr"},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: testNamespace, Name: sa.Name}}}
	for _, o := range []client.Object{sa, role, binding} {
		if err := k8s.Create(ctx, o); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = k8s.Delete(context.Background(), o) })
	}
	// setAddress plays the node's kubelet, writing its InternalIP.
	setAddress := func(node *corev1.Node, addr string) {
		t.Helper()
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(node), node); err != nil {
			t.Fatal(err)
		}
		node.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
		if err := k8s.Status().Update(ctx, node); err != nil {
			t.Fatal(err)
		}
	}
	a := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "shared-a"}}
	b := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "shared-b"}}
	createNode(t, a)
	createNode(t, b)
	setAddress(a, ip)
	setAddress(b, "10.1.2.6")
	agentA, agentB := agentClient(t, svc, a.Name), agentClient(t, svc, b.Name)

	if cert, denied := certVerdict(t, requestCert(t, agentA, a.Name, ip)); len(cert) == 0 {
		t.Fatalf("node A's request for its own address, held by no other node: denied %q", denied)
	}

	setAddress(b, ip)
	signed := 0
	cert, denied := certVerdict(t, requestCert(t, agentB, b.Name, ip))
	if len(cert) > 0 {
		signed++
	}
	if signed != 0 || !strings.Contains(denied, "address "+ip+" is also node shared-a's") {
		t.Errorf("node B claiming A's address: certificates for it signed %d, want 0; denied %q", signed, denied)
	}
	csr := requestCert(t, agentA, a.Name, ip)
	if cert, denied := certVerdict(t, csr); len(cert) > 0 || !strings.Contains(denied, "also node shared-b's") {
		t.Errorf("node A's renewal while B claims its address: signed %v, denied %q; want denied", len(cert) > 0, denied)
	}
	for _, c := range csr.Status.Conditions {
		if c.Type == certificatesv1.CertificateDenied && c.Reason != ReasonAddressNotUnique {
			t.Errorf("denial reason %q, want %s", c.Reason, ReasonAddressNotUnique)
		}
	}

	// B gives the address up: once the operator's cache has seen it, A's
	// request is signed again.
	setAddress(b, "10.1.2.6")
	poll.UntilNil(t, 30*time.Second, "the operator's cache sees node B's address", func() error {
		n := &corev1.Node{}
		if err := mgrCache.Get(ctx, client.ObjectKeyFromObject(b), n); err != nil {
			return err
		}
		if len(n.Status.Addresses) != 1 || n.Status.Addresses[0].Address != "10.1.2.6" {
			return fmt.Errorf("addresses %v", n.Status.Addresses)
		}
		return nil
	})
	if cert, denied := certVerdict(t, requestCert(t, agentA, a.Name, ip)); len(cert) == 0 {
		t.Errorf("node A's request once the address is its alone: denied %q", denied)
	}
}
