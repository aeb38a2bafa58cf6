package metricsauth

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
)

// Defaults for the zero values of Options.
const (
	DefaultTTL       = time.Minute
	DefaultDeniedTTL = 10 * time.Second
	DefaultMaxCached = 1024
	DefaultCARefresh = time.Minute
)

// Options configure a Guard.
type Options struct {
	// Kube makes the TokenReviews and SubjectAccessReviews and reads the
	// client CA ConfigMap.
	Kube kubernetes.Interface
	Log  logr.Logger
	// Public are paths served without authentication (e.g. "/healthz",
	// "/readyz": the kubelet's probes carry no credentials).
	Public []string
	// Hosts are the serving certificate's names besides "localhost" and
	// 127.0.0.1 (DNS names or IP addresses).
	Hosts []string
	// TTL caches an allowed decision (default 1m), DeniedTTL a denied one
	// (default 10s, so that a new RoleBinding takes effect soon); at most
	// MaxCached entries (default 1024, oldest evicted).
	TTL, DeniedTTL time.Duration
	MaxCached      int
	// CARefresh is how often the client CA is re-read (default 1m).
	CARefresh time.Duration
	// Now, for tests (default time.Now).
	Now func() time.Time
}

// Guard authenticates and authorizes requests against the cluster.
type Guard struct {
	kube   kubernetes.Interface
	log    logr.Logger
	now    func() time.Time
	public map[string]bool
	ttl    time.Duration
	denied time.Duration
	tls    *tls.Config
	cache  *cache

	// ca is the current client CA; nil while none could be read.
	ca atomic.Pointer[clientCA]
	// caMu serializes reads of the ConfigMap and caProblem, the last
	// problem logged, so that an absent CA is logged once, not every
	// CARefresh.
	caMu      sync.Mutex
	caProblem string
	// done is closed when the CA refresher has stopped.
	done chan struct{}
}

// New starts a Guard: it reads the cluster's client CA and re-reads it
// every CARefresh until ctx ends, and makes a self-signed serving
// certificate in memory. A missing or unreadable client CA is no error:
// client certificates are then refused (logged once) and tokens still
// work.
func New(ctx context.Context, o Options) (*Guard, error) {
	if o.Kube == nil {
		return nil, errors.New("metricsauth: Options.Kube is required")
	}
	o = withDefaults(o)
	cert, err := servingCert(o.Hosts, o.Now())
	if err != nil {
		return nil, fmt.Errorf("metricsauth: serving certificate: %w", err)
	}
	g := &Guard{
		kube:   o.Kube,
		log:    o.Log.WithName("metricsauth"),
		now:    o.Now,
		public: make(map[string]bool, len(o.Public)),
		ttl:    o.TTL,
		denied: o.DeniedTTL,
		tls: &tls.Config{
			Certificates: []tls.Certificate{cert},
			MinVersion:   tls.VersionTLS12,
			// Verified in the handler against the current CA, so that
			// the CA can change without a restart.
			ClientAuth: tls.RequestClientCert,
		},
		cache: newCache(o.MaxCached),
		done:  make(chan struct{}),
	}
	for _, p := range o.Public {
		g.public[p] = true
	}
	g.refreshCA(ctx)
	go g.refreshLoop(ctx, o.CARefresh)
	return g, nil
}

func withDefaults(o Options) Options {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.DeniedTTL <= 0 {
		o.DeniedTTL = DefaultDeniedTTL
	}
	if o.MaxCached <= 0 {
		o.MaxCached = DefaultMaxCached
	}
	if o.CARefresh <= 0 {
		o.CARefresh = DefaultCARefresh
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return o
}

// TLSConfig is the server's: its certificate, TLS 1.2 minimum, and
// tls.RequestClientCert (a client certificate is verified by Wrap's
// handler). Each call returns a copy the caller may change.
func (g *Guard) TLSConfig() *tls.Config {
	return g.tls.Clone()
}
