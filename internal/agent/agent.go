package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/discovery"
	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// Options configure an Agent. Config and OpenDevice are required.
type Options struct {
	Config *config.AgentConfig
	Log    logr.Logger
	// RenewCertificate, when the agent requests its own node certificate
	// (cmd/node-agent wires nodecert.Keeper.Renew), replaces it now: the
	// admin op renewCertificate (rdmavisor agent renew-certificate).
	RenewCertificate func(context.Context) (*x509.Certificate, error)
	// PodEvents, when set, is told each allocation bound to a pod, so
	// that the pod's Events say what it holds: its container's
	// environment, which CDI and the device plugin fill, shows nothing.
	PodEvents PodEvents
	// OpenDevice opens the node's RDMA device for Config (the wiring in
	// cmd/node-agent chooses the provider). New calls it once; the agent
	// owns the device from then on and closes it on Close, or when New
	// fails.
	OpenDevice func(*config.AgentConfig) (verbs.Device, error)
	// OpenRails, when set, opens the devices of every rail instead
	// (device.OpenRails; config.DeviceConfig.Rails), rail 0 first: the
	// agent runs an engine on each, and owns them as OpenDevice's.
	OpenRails func(*config.AgentConfig) ([]verbs.Device, error)
	// Discovery finds peer agents (default: the config's static peers).
	Discovery discovery.Source
	// PodAddresses, when set (Kubernetes mode), says which node runs a
	// pod IP, instead of the peers' announcements (podaddr.go).
	PodAddresses PodAddresses
	// Policy, when set (Kubernetes mode), checks each vconn dial against
	// the cluster's NetworkPolicies (policy.go); nil allows every dial.
	Policy Policy
	// ControlListener serves the gRPC control plane (default: a TCP
	// listener on the bind address and Config.ControlPort).
	ControlListener net.Listener
	// MetricsListener serves /metrics, /healthz and /readyz (default: a
	// TCP listener on Config.MetricsAddress).
	MetricsListener net.Listener
	// MetricsGuard, when set (Kubernetes mode: package metricsauth), serves
	// /metrics over TLS to callers the cluster authorizes, the probes'
	// paths as before.
	MetricsGuard MetricsGuard
	// TuneEngine adjusts the engine configuration derived from Config.
	TuneEngine func(*engine.Config)
	// HeartbeatInterval and HeartbeatTimeout: a peer that has not answered
	// a beat for HeartbeatTimeout is declared gone (defaults 250ms, 2s).
	HeartbeatInterval, HeartbeatTimeout time.Duration
	// RailCheckInterval is how often each rail's port is queried
	// (default DefaultRailCheckInterval): a rail whose port is not ACTIVE
	// takes no new allocation (rail.go).
	RailCheckInterval time.Duration
}

// Agent is a running node agent.
type Agent struct {
	cfg  *config.AgentConfig
	opts Options
	log  logr.Logger
	disc discovery.Source
	dev  verbs.Device
	eng  *engine.Engine
	// devs and engines are the rails' (multi-rail), rail 0 first: dev and
	// eng are rail 0's. An allocation's vconns use its rail's engine.
	devs        []verbs.Device
	engines     []*engine.Engine
	incarnation uint64
	ctlAddr     string // the advertised control address

	grpc    *grpc.Server
	ctlLn   net.Listener
	http    *http.Server
	adminLn *net.UnixListener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	ready  atomic.Bool
	// stopping: Close has begun. Vconns are then left to the engine's
	// close, without a FIN, so peers see the agent go (ErrPeerGone), not
	// their peer applications close.
	stopping atomic.Bool

	// registered shares limits.registeredBytes among the allocations
	// (registered.go).
	registered registeredPool

	mu        sync.Mutex
	closed    bool                               // guarded by mu
	allocs    map[string]*allocation             // guarded by mu
	pods      map[string]admin.Pod               // by UID; guarded by mu
	podSeq    map[string]uint64                  // by UID: when each pod registered (the later of two of one name wins); guarded by mu
	podsVer   uint64                             // counts changes of pods' IPs, which peers are told (announce.go); guarded by mu
	listeners map[portKey]*listener              // guarded by mu
	announced map[string]map[netip.Addr]struct{} // the pod IPs each peer node announced; guarded by mu
	remotes   map[string]*remote                 // by node; guarded by mu
	gids      map[verbs.GID]string               // the node each engine peer's GID is bound to (bindGID); guarded by mu
	railDown  []string                           // by rail: why its device cannot carry vconns, "" while it can (rail.go); guarded by mu

	creds credentials.TransportCredentials // the control plane's, both ways
	tls   *pki.Source                      // nil without TLS
}

// New starts an agent: device, engine, control plane, admin socket and
// health endpoints. Close stops it.
func New(opts Options) (_ *Agent, err error) {
	cfg := opts.Config
	if cfg == nil {
		return nil, errors.New("agent: no configuration")
	}
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("agent: invalid configuration: %w", err)
	}
	if opts.HeartbeatInterval == 0 {
		opts.HeartbeatInterval = 250 * time.Millisecond
	}
	if opts.HeartbeatTimeout == 0 {
		opts.HeartbeatTimeout = 2 * time.Second
	}
	if opts.RailCheckInterval <= 0 {
		opts.RailCheckInterval = DefaultRailCheckInterval
	}
	a := &Agent{
		cfg: cfg, opts: opts, log: opts.Log.WithValues("node", cfg.NodeName),
		// Never 0: peers refuse a beat without an incarnation.
		disc: opts.Discovery, incarnation: max(rand.Uint64(), 1),
		allocs: make(map[string]*allocation), pods: make(map[string]admin.Pod), podSeq: make(map[string]uint64),
		listeners: make(map[portKey]*listener), remotes: make(map[string]*remote),
		announced: make(map[string]map[netip.Addr]struct{}),
		gids:      make(map[verbs.GID]string),
	}
	if a.disc == nil {
		a.disc = discovery.StaticFromConfig(cfg)
	}
	a.loadPods()
	a.ctx, a.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			err = errors.Join(err, a.Close())
		}
	}()
	if err := a.openDevice(); err != nil {
		return nil, err
	}
	a.railDown = make([]string, len(a.devs))
	for i, dev := range a.devs {
		ec, err := a.engineConfig(dev, i)
		if err != nil {
			return nil, err
		}
		e, err := engine.New(ec)
		if err != nil {
			return nil, fmt.Errorf("agent: start engine of rail %d: %w", i, err)
		}
		a.engines = append(a.engines, e)
	}
	a.eng = a.engines[0]
	if err := a.serveControl(); err != nil {
		return nil, err
	}
	if err := a.serveAdmin(); err != nil {
		return nil, err
	}
	if err := a.serveHealth(); err != nil {
		return nil, err
	}
	// Rails as they are now, before any allocation: then every interval.
	a.checkRails()
	a.wg.Add(2)
	go func() {
		defer a.wg.Done()
		a.watchRails()
	}()
	go func() {
		defer a.wg.Done()
		a.disc.Watch(a.ctx, a.peersChanged)
	}()
	a.ready.Store(true)
	a.log.Info("Agent started", "control", a.ctlAddr, "admin", cfg.AdminSocket, "gid", a.eng.GID(), "rails", len(a.engines))
	return a, nil
}

func (a *Agent) bindAddr() (netip.Addr, error) {
	if a.cfg.Soft.BindAddress == "" {
		return netip.Addr{}, errors.New("agent: no bind address: set soft.bindAddress, --node-ip or NODE_IP")
	}
	return netip.ParseAddr(a.cfg.Soft.BindAddress)
}

func (a *Agent) openDevice() error {
	if a.opts.OpenRails != nil {
		devs, err := a.opts.OpenRails(a.cfg)
		if err != nil {
			return fmt.Errorf("agent: open %s devices: %w", a.cfg.Device.Provider, err)
		}
		if len(devs) == 0 {
			return errors.New("agent: OpenRails opened no device")
		}
		a.devs, a.dev = devs, devs[0]
		return nil
	}
	if a.opts.OpenDevice == nil {
		return errors.New("agent: no device: Options.OpenDevice is required")
	}
	dev, err := a.opts.OpenDevice(a.cfg)
	if err != nil {
		return fmt.Errorf("agent: open %s device: %w", a.cfg.Device.Provider, err)
	}
	a.dev, a.devs = dev, []verbs.Device{dev}
	return nil
}

// engineOf returns the engine of rail, or an error naming how many rails
// this node has.
func (a *Agent) engineOf(rail int) (*engine.Engine, error) {
	if rail < 0 || rail >= len(a.engines) {
		return nil, fmt.Errorf("agent: rail %d: node %s has %d rail(s)", rail, a.cfg.NodeName, len(a.engines))
	}
	return a.engines[rail], nil
}

// engineConfig derives the configuration of the engine of rail on dev:
// half the buffer pool receives, the other half sends (a pool per rail).
func (a *Agent) engineConfig(dev verbs.Device, rail int) (engine.Config, error) {
	tr, err := a.cfg.Transport.Kind()
	if err != nil {
		return engine.Config{}, fmt.Errorf("agent: %w", err)
	}
	const chunk = engine.DefaultChunkSize
	clamp := func(v, lo, hi int64) int { return int(max(lo, min(hi, v))) }
	ec := engine.Config{
		Device:     dev,
		Log:        a.log.WithName("engine").WithValues("rail", rail),
		QPsPerPeer: a.cfg.QPsPerPeer,
		Pollers:    a.cfg.PollerCount(),
		MaxMessage: int(a.cfg.MaxMessageBytes),
		Transport:  tr,
		ChunkSize:  chunk,
		// The pool: half for send buffers (one of each small class per
		// chunk-sized one), three eighths for the SRQ, an eighth for the
		// datagram SRQ (UC and UD, Auto's datagrams).
		RecvBuffers:  clamp(a.cfg.BufferPoolBytes*3/8/chunk, 64, 1<<15),
		DgramBuffers: clamp(a.cfg.BufferPoolBytes/8/chunk, 32, 1<<15),
		SendBuffers:  clamp(a.cfg.BufferPoolBytes/2/(256+1024+chunk/4), 64, 1<<15),
		// The node-wide bound: the engine counts a region until its
		// memory is deregistered, whoever held it.
		MaxRegisteredBytes: a.cfg.Limits.RegisteredBytes,
	}
	if a.opts.TuneEngine != nil {
		a.opts.TuneEngine(&ec)
	}
	return ec, nil
}

func (a *Agent) serveControl() error {
	ln := a.opts.ControlListener
	if ln == nil {
		addr, err := a.bindAddr()
		if err != nil {
			return err
		}
		if ln, err = net.Listen("tcp", net.JoinHostPort(addr.String(), fmt.Sprint(a.cfg.ControlPort))); err != nil {
			return fmt.Errorf("agent: control plane: %w", err)
		}
	}
	a.ctlLn = ln
	a.ctlAddr = ln.Addr().String()
	creds, err := a.controlCreds()
	if err != nil {
		return err
	}
	a.creds = creds
	// Bounds per peer on what it has in flight (peerlimit.go).
	a.grpc = grpc.NewServer(append([]grpc.ServerOption{grpc.Creds(creds)}, newPeerLimiter(a).serverOptions()...)...)
	controlpb.RegisterControlServer(a.grpc, &controlServer{a: a})
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.grpc.Serve(ln); err != nil {
			a.log.Error(err, "Control plane stopped")
		}
	}()
	return nil
}

func (a *Agent) serveHealth() error {
	ln := a.opts.MetricsListener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", a.cfg.MetricsAddress); err != nil {
			return fmt.Errorf("agent: metrics address: %w", err)
		}
	}
	metrics, err := a.metricsHandler()
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("agent: metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	ln, h := Guarded(a.opts.MetricsGuard, ln, mux)
	a.http = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		if err := a.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			a.log.Error(err, "Health endpoints stopped")
		}
	}()
	return nil
}

// MetricsGuard puts the metrics address behind the cluster's
// authentication and authorization (*metricsauth.Guard).
type MetricsGuard interface {
	// Listen serves TLS and plain HTTP on ln's port.
	Listen(ln net.Listener) net.Listener
	// Wrap answers the probes' paths to anyone and the others to callers
	// over TLS whom the cluster authorizes.
	Wrap(h http.Handler) http.Handler
}

// Guarded is ln and h as g serves them; as they are when g is nil.
func Guarded(g MetricsGuard, ln net.Listener, h http.Handler) (net.Listener, http.Handler) {
	if g == nil {
		return ln, h
	}
	return g.Listen(ln), g.Wrap(h)
}

// ControlAddress is the agent's gRPC address.
func (a *Agent) ControlAddress() string { return a.ctlAddr }

// Engine is the agent's engine (for statistics).
func (a *Agent) Engine() *engine.Engine { return a.eng }

// Rails returns the engines of the agent's rails, rail 0 (Engine) first.
func (a *Agent) Rails() []*engine.Engine { return append([]*engine.Engine(nil), a.engines...) }

// NodeName is the agent's node.
func (a *Agent) NodeName() string { return a.cfg.NodeName }

// Ready reports whether the agent serves.
func (a *Agent) Ready() bool { return a.ready.Load() }

// Close stops the agent: applications' connections end, vconns fail,
// peers see the heartbeats stop.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	a.stopping.Store(true)
	allocs := make([]*allocation, 0, len(a.allocs))
	for _, al := range a.allocs {
		allocs = append(allocs, al)
	}
	remotes := make([]*remote, 0, len(a.remotes))
	for _, r := range a.remotes {
		remotes = append(remotes, r)
	}
	a.mu.Unlock()
	a.ready.Store(false)
	a.cancel()
	var errs []error
	if a.adminLn != nil {
		errs = append(errs, a.adminLn.Close())
		_ = os.Remove(a.cfg.AdminSocket)
	}
	for _, al := range allocs {
		al.shutdown(true)
	}
	if a.grpc != nil {
		a.grpc.Stop()
	}
	for _, r := range remotes {
		r.close()
	}
	if a.http != nil {
		errs = append(errs, a.http.Close())
	}
	a.wg.Wait()
	for _, e := range a.engines {
		errs = append(errs, e.Close())
	}
	for _, d := range a.devs {
		errs = append(errs, d.Close())
	}
	a.log.Info("Agent stopped")
	return errors.Join(errs...)
}
