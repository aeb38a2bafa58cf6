package metricsauth

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// clock is a settable Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// cluster plays the API server: tokens it authenticates, a policy it
// authorizes with, and counts of the reviews it was asked for.
type cluster struct {
	kube   *fake.Clientset
	tokens map[string]authenticationv1.UserInfo

	mu      sync.Mutex
	policy  func(authorizationv1.SubjectAccessReviewSpec) (bool, string, error)
	tokErr  error
	lastSAR authorizationv1.SubjectAccessReviewSpec

	tokenReviews atomic.Int32
	sars         atomic.Int32
}

func newCluster(objs ...runtime.Object) *cluster {
	c := &cluster{kube: fake.NewClientset(objs...), tokens: map[string]authenticationv1.UserInfo{}}
	c.setPolicy(func(authorizationv1.SubjectAccessReviewSpec) (bool, string, error) { return true, "", nil })
	c.kube.PrependReactor("create", "tokenreviews", c.reviewToken)
	c.kube.PrependReactor("create", "subjectaccessreviews", c.reviewAccess)
	return c
}

func (c *cluster) setPolicy(p func(authorizationv1.SubjectAccessReviewSpec) (bool, string, error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.policy = p
}

func (c *cluster) sar() authorizationv1.SubjectAccessReviewSpec {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastSAR
}

func (c *cluster) reviewToken(a k8stesting.Action) (bool, runtime.Object, error) {
	c.tokenReviews.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tokErr != nil {
		return true, nil, c.tokErr
	}
	tr := a.(k8stesting.CreateAction).GetObject().(*authenticationv1.TokenReview).DeepCopy()
	u, ok := c.tokens[tr.Spec.Token]
	tr.Status = authenticationv1.TokenReviewStatus{Authenticated: ok, User: u}
	if !ok {
		tr.Status.Error = "invalid bearer token"
	}
	return true, tr, nil
}

func (c *cluster) reviewAccess(a k8stesting.Action) (bool, runtime.Object, error) {
	c.sars.Add(1)
	sar := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SubjectAccessReview).DeepCopy()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.lastSAR = sar.Spec
	allowed, reason, err := c.policy(sar.Spec)
	if err != nil {
		return true, nil, err
	}
	sar.Status = authorizationv1.SubjectAccessReviewStatus{Allowed: allowed, Reason: reason}
	return true, sar, nil
}

// fixture is a Guard serving a counting handler over TLS.
type fixture struct {
	*cluster
	g      *Guard
	srv    *httptest.Server
	clock  *clock
	served atomic.Int32
}

// start starts a Guard on c with o (Kube, Log and Now filled in) and
// serves it; the Guard's refresher is stopped and awaited at cleanup.
func start(t *testing.T, c *cluster, o Options) *fixture {
	t.Helper()
	f := &fixture{cluster: c, clock: &clock{t: time.Now()}}
	o.Kube, o.Now = c.kube, f.clock.Now
	if o.Log.GetSink() == nil {
		o.Log = testr.New(t)
	}
	g, err := New(t.Context(), o)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { <-g.done }) // after t.Context is cancelled: no log after the test
	f.g = g
	f.srv = httptest.NewUnstartedServer(g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.served.Add(1)
		io.WriteString(w, "metric_total 1\n")
	})))
	f.srv.TLS = g.TLSConfig()
	f.srv.StartTLS()
	t.Cleanup(f.srv.Close)
	return f
}

// client trusts the Guard's certificate and presents certs, if any.
func (f *fixture) client(t *testing.T, certs ...tls.Certificate) *http.Client {
	pool := x509.NewCertPool()
	pool.AddCert(f.srv.Certificate())
	tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: certs}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

type response struct {
	code   int
	body   string
	header http.Header
}

// get requests path with c, with a bearer token unless it is "".
func (f *fixture) get(t *testing.T, c *http.Client, path, token string) response {
	t.Helper()
	return fetch(t, c, f.srv.URL+path, token)
}

// fetch GETs url with c, with a bearer token unless it is "".
func fetch(t *testing.T, c *http.Client, url, token string) response {
	t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("GET %s: read body: %v", url, err)
	}
	return response{code: res.StatusCode, body: string(body), header: res.Header}
}

// testCA is a certificate authority for client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  string
}

func newTestCA(t *testing.T, name string) *testCA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	p := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	return &testCA{cert: cert, key: key, pem: string(p)}
}

// issue makes a client certificate for cn in orgs.
func (ca *testCA) issue(t *testing.T, cn string, orgs ...string) tls.Certificate {
	t.Helper()
	return ca.issueFor(t, x509.ExtKeyUsageClientAuth, cn, orgs...)
}

// issueFor makes a certificate for cn in orgs, for usage.
func (ca *testCA) issueFor(t *testing.T, usage x509.ExtKeyUsage, cn string, orgs ...string) tls.Certificate {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: cn, Organization: orgs},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// caConfigMap is the cluster's client CA ConfigMap holding bundle.
func caConfigMapOf(bundle string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: caNamespace, Name: caConfigMap},
		Data:       map[string]string{caKey: bundle},
	}
}
