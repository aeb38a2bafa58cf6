package metricsauth

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestRefresherStops: the CA refresher goroutine ends with New's context.
func TestRefresherStops(t *testing.T) {
	c := newCluster()
	ctx, cancel := context.WithCancel(t.Context())
	g, err := New(ctx, Options{Kube: c.kube, CARefresh: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.done:
		t.Fatal("refresher stopped before its context ended")
	case <-time.After(20 * time.Millisecond):
	}
	cancel()
	select {
	case <-g.done:
	case <-time.After(5 * time.Second):
		t.Fatal("refresher still running 5s after its context ended")
	}
}

// TestMissingCALoggedOnce: an absent CA is logged when first seen and
// when it changes, not on every refresh.
func TestMissingCALoggedOnce(t *testing.T) {
	var mu sync.Mutex
	var notAccepted, loaded int
	log := funcr.New(func(_, args string) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case strings.Contains(args, "client certificates are not accepted"):
			notAccepted++
		case strings.Contains(args, "client CA loaded"):
			loaded++
		}
	}, funcr.Options{})
	f := start(t, newCluster(), Options{Log: log})
	f.g.refreshCA(t.Context())
	f.g.refreshCA(t.Context())

	ca := newTestCA(t, "cluster CA")
	if _, err := f.kube.CoreV1().ConfigMaps(caNamespace).Create(t.Context(), caConfigMapOf(ca.pem), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.g.refreshCA(t.Context())
	f.g.refreshCA(t.Context())
	if err := f.kube.CoreV1().ConfigMaps(caNamespace).Delete(t.Context(), caConfigMap, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	f.g.refreshCA(t.Context())

	mu.Lock()
	defer mu.Unlock()
	if notAccepted != 2 || loaded != 1 {
		t.Errorf("logged %d times that certificates are not accepted (want 2: at start and after the deletion), %d times a CA loaded (want 1)",
			notAccepted, loaded)
	}
	if f.g.ca.Load() != nil {
		t.Error("a deleted CA is still trusted")
	}
}
