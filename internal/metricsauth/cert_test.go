package metricsauth

import (
	"crypto/x509"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
)

func TestClientCertificate(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	f := start(t, newCluster(caConfigMapOf(ca.pem)), Options{})

	res := f.get(t, f.client(t, ca.issue(t, "alice", "team")), "/metrics", "")
	if res.code != http.StatusOK || res.body != "metric_total 1\n" {
		t.Fatalf("got %d %q, want 200 and the handler's body", res.code, res.body)
	}
	sar := f.sar()
	// The groups the API server gives a certificate's user:
	// Organization, and system:authenticated, as every user.
	if want := []string{"team", "system:authenticated"}; sar.User != "alice" || !reflect.DeepEqual(sar.Groups, want) {
		t.Errorf("access review for user %q groups %v, want alice %v", sar.User, sar.Groups, want)
	}
	if n := f.tokenReviews.Load(); n != 0 {
		t.Errorf("%d token reviews for a certificate", n)
	}
}

func TestClientCertificateOtherCA(t *testing.T) {
	ca, other := newTestCA(t, "cluster CA"), newTestCA(t, "other CA")
	c := newCluster(caConfigMapOf(ca.pem))
	c.tokens["good"] = prometheus
	f := start(t, c, Options{})
	cl := f.client(t, other.issue(t, "mallory", "system:masters"))

	if res := f.get(t, cl, "/metrics", ""); res.code != http.StatusUnauthorized {
		t.Fatalf("certificate of another CA: got %d, want 401", res.code)
	}
	if n := f.sars.Load(); n != 0 {
		t.Errorf("%d access reviews for an unverified certificate", n)
	}
	// The certificate is ignored, not fatal: a token still counts.
	if res := f.get(t, cl, "/metrics", "good"); res.code != http.StatusOK {
		t.Errorf("unverified certificate and a good token: got %d, want 200", res.code)
	}
	if u := f.sar().User; u != prometheus.Username {
		t.Errorf("access review for %q, want the token's user", u)
	}
}

func TestNoClientCA(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	c := newCluster() // no ConfigMap
	c.tokens["good"] = prometheus
	f := start(t, c, Options{})

	if res := f.get(t, f.client(t, ca.issue(t, "alice")), "/metrics", ""); res.code != http.StatusUnauthorized {
		t.Errorf("certificate without a client CA: got %d, want 401", res.code)
	}
	if res := f.get(t, f.client(t), "/metrics", "good"); res.code != http.StatusOK {
		t.Errorf("token without a client CA: got %d, want 200", res.code)
	}
}

func TestClientCARotation(t *testing.T) {
	oldCA, newCA := newTestCA(t, "old CA"), newTestCA(t, "new CA")
	f := start(t, newCluster(caConfigMapOf(oldCA.pem)), Options{})
	oldClient := f.client(t, oldCA.issue(t, "alice", "team"))
	newClient := f.client(t, newCA.issue(t, "alice", "team"))

	if res := f.get(t, oldClient, "/metrics", ""); res.code != http.StatusOK {
		t.Fatalf("old CA's certificate before rotation: got %d, want 200", res.code)
	}
	if res := f.get(t, newClient, "/metrics", ""); res.code != http.StatusUnauthorized {
		t.Fatalf("new CA's certificate before rotation: got %d, want 401", res.code)
	}
	_, err := f.kube.CoreV1().ConfigMaps(caNamespace).Update(t.Context(), caConfigMapOf(newCA.pem), metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.g.refreshCA(t.Context())

	// The old certificate's allowed decision is still cached: the
	// certificate itself must be checked again.
	if res := f.get(t, oldClient, "/metrics", ""); res.code != http.StatusUnauthorized {
		t.Errorf("old CA's certificate after rotation: got %d, want 401", res.code)
	}
	if res := f.get(t, newClient, "/metrics", ""); res.code != http.StatusOK {
		t.Errorf("new CA's certificate after rotation: got %d, want 200", res.code)
	}
}

// TestClientCAAppears checks the refresher itself: a CA published after
// the Guard started is picked up within a few CARefresh periods.
func TestClientCAAppears(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	f := start(t, newCluster(), Options{CARefresh: 10 * time.Millisecond})
	cl := f.client(t, ca.issue(t, "alice", "team"))

	if res := f.get(t, cl, "/metrics", ""); res.code != http.StatusUnauthorized {
		t.Fatalf("before the CA is published: got %d, want 401", res.code)
	}
	if _, err := f.kube.CoreV1().ConfigMaps(caNamespace).Create(t.Context(), caConfigMapOf(ca.pem), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for f.g.ca.Load() == nil {
		if time.Now().After(deadline) {
			t.Fatal("client CA not picked up within 5s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if res := f.get(t, cl, "/metrics", ""); res.code != http.StatusOK {
		t.Errorf("after the CA is published: got %d, want 200", res.code)
	}
}

func TestBadCABundle(t *testing.T) {
	for name, bundle := range map[string]string{
		"empty":   "",
		"not PEM": "hello",
		"bad DER": "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
	} {
		t.Run(name, func(t *testing.T) {
			f := start(t, newCluster(caConfigMapOf(bundle)), Options{})
			if f.g.ca.Load() != nil {
				t.Errorf("bundle %q accepted as a client CA", bundle)
			}
		})
	}
}

// TestServerCertificateRefusedAsClient: a certificate of the cluster's CA
// for serving only must not pass as a client's.
func TestServerCertificateRefusedAsClient(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	f := start(t, newCluster(caConfigMapOf(ca.pem)), Options{})
	cert := ca.issueFor(t, x509.ExtKeyUsageServerAuth, "kube-apiserver", "system:masters")

	if res := f.get(t, f.client(t, cert), "/metrics", ""); res.code != http.StatusUnauthorized {
		t.Errorf("serving certificate as a client's: got %d, want 401", res.code)
	}
	if n := f.sars.Load(); n != 0 {
		t.Errorf("%d access reviews for a certificate not for client authentication", n)
	}
}

// TestCAKeptOnAPIError: a failed read (the API server briefly away) does
// not lock certificate users out.
func TestCAKeptOnAPIError(t *testing.T) {
	ca := newTestCA(t, "cluster CA")
	f := start(t, newCluster(caConfigMapOf(ca.pem)), Options{})
	f.kube.PrependReactor("get", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	f.g.refreshCA(t.Context())

	if res := f.get(t, f.client(t, ca.issue(t, "alice", "team")), "/metrics", ""); res.code != http.StatusOK {
		t.Errorf("after a failed re-read: got %d, want 200 with the previous CA", res.code)
	}
}
