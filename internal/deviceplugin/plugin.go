package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/cdispec"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/rdmadev"
)

// ResourceDomain is the only domain of the resources a plugin serves (as
// the RDMAService schema allows only it): the plugin recognises its own
// sockets by it.
const ResourceDomain = "rdmavisor.io"

// Defaults of Options.
const (
	DefaultKubeletDir     = "/var/lib/kubelet/device-plugins"
	DefaultHealthInterval = 5 * time.Second
	DefaultGCInterval     = time.Minute
	DefaultGCGrace        = time.Minute
	DefaultRetryInterval  = 5 * time.Second
	DefaultRequestTimeout = 10 * time.Second
)

// Options configure a Plugin.
type Options struct {
	// Config is the node's agent configuration: resourceName,
	// vconnsPerNode (the devices advertised), socketDir and adminSocket.
	Config *config.AgentConfig
	// KubeletDir is the kubelet's device-plugin directory, holding
	// kubelet.sock and the plugin's socket.
	KubeletDir string
	// SocketName is the plugin's socket in KubeletDir. By default each
	// registration gets a socket of its own: the resource name with '/'
	// replaced by '_', a suffix unique to the process and the
	// registration, and ".sock" (see Plugin.sockBase).
	SocketName string
	// PodResourcesSocket is the kubelet pod-resources API, used when
	// PodResources is nil.
	PodResourcesSocket string
	// Agent defaults to the admin socket of Config.
	Agent admin.Agent
	// PodResources defaults to a client of PodResourcesSocket.
	PodResources PodResources
	// HealthInterval is how often the agent is probed.
	HealthInterval time.Duration
	// GCInterval is how often allocations of gone pods are collected;
	// GCGrace protects allocations this process created that recently.
	GCInterval, GCGrace time.Duration
	// RetryInterval spaces failed registrations.
	RetryInterval time.Duration
	// RequestTimeout bounds every call to the agent, the kubelet and the
	// plugin's own socket.
	RequestTimeout time.Duration
	// Key derives the allocation ids (AllocationID). Nil: the key in
	// KeyFile of Config.StateDir, made there if missing (LoadOrCreateKey).
	Key *Key
	// CDI adds a CDI device "<resourceName>=<allocation id>" to every
	// container and writes its spec (package cdispec) in CDISpecDir,
	// default cdispec.DefaultDir. The mounts and environment are still
	// answered too: a runtime without CDI (containerd before 1.7) ignores
	// the device, and one with it applies the same edits twice, harmlessly.
	CDI        bool
	CDISpecDir string
	// Rails are the RDMA devices that may serve the vconns, as package
	// rdmadev lists them (Rails): the advertised devices report the NUMA
	// node of the one the agent serves them with (TopologyInfo), so that
	// the kubelet's Topology Manager can align a pod with its NIC, and
	// GetPreferredAllocation prefers one NUMA node. With one rail that is
	// known at once; with several, once the agent's status names its
	// device. Empty, or a rail of unknown NUMA node: no topology.
	Rails []rdmadev.Device
	// Registerer receives the metrics (default: a new registry).
	Registerer prometheus.Registerer
	Log        logr.Logger
}

// Plugin is the device plugin. Run serves it.
type Plugin struct {
	opts    Options
	key     Key            // derives the allocation ids
	n       int            // devices advertised
	topo    *topology      // where the advertised devices are
	cdi     *cdispec.Specs // the allocations' CDI specs; nil without Options.CDI
	log     logr.Logger
	health  *health
	metrics *metrics
	restart chan struct{} // Restart requests; buffered 1
	kick    chan struct{} // garbage collection requests; buffered 1
	// sockBase names the sockets of the default scheme: sockBase"-*.sock"
	// (and sockBase".sock", as earlier versions named theirs); empty
	// when Options.SocketName was given. Each registration serves a new
	// socket: a kubelet (v1.37 here) keys a plugin by resource and
	// socket, and two registrations at one socket in a few milliseconds
	// (a kubelet restart makes them) confused it: it dropped both
	// clients, and then either refused the socket for minutes ("device
	// plugin already connected") or kept a dead plugin's devices
	// allocatable for good. At a new socket a registration is a new
	// plugin, and the old one goes when its stream ends.
	sockBase string
	stale    *regexp.Regexp // matches the names of sockBase's sockets; nil with Options.SocketName
	sock     string         // the socket served now; Run's
	starts   int            // servers started; Run's
	born     string         // when New ran, base 36: tells this process's sockets from an earlier one's with its pid

	mu      sync.Mutex
	created map[string]time.Time // allocation id -> when this process last allocated it; guarded by mu
	running bool                 // guarded by mu
}

// New checks the options and fills their defaults.
func New(o Options) (*Plugin, error) {
	if o.Config == nil {
		return nil, errors.New("device plugin: no configuration")
	}
	if o.Config.VConnsPerNode < 1 || o.Config.ResourceName == "" {
		return nil, fmt.Errorf("device plugin: want vconnsPerNode > 0 and a resource name, have %d and %q", o.Config.VConnsPerNode, o.Config.ResourceName)
	}
	// The kubelet gives a resource to the last plugin that registers it:
	// a plugin for another vendor's resource would take it over.
	if !strings.HasPrefix(o.Config.ResourceName, ResourceDomain+"/") {
		return nil, fmt.Errorf("device plugin: resource %q is not in the %s domain: it would take the resource over from its own plugin", o.Config.ResourceName, ResourceDomain)
	}
	if o.KubeletDir == "" {
		o.KubeletDir = DefaultKubeletDir
	}
	base := ""
	var stale *regexp.Regexp
	if o.SocketName == "" {
		base = strings.ReplaceAll(o.Config.ResourceName, "/", "_")
		// The names this and earlier versions gave their sockets: base,
		// then "-pid-born-count", "-pid-born" or nothing. Exactly these:
		// the sockets of another resource whose name starts with this
		// one's (rdmavisor.io/vconn-ib) are another plugin's.
		stale = regexp.MustCompile(`^` + regexp.QuoteMeta(base) + `(-[0-9]+-[0-9a-z]+(-[0-9]+)?)?\.sock$`)
	}
	if o.PodResourcesSocket == "" {
		o.PodResourcesSocket = DefaultPodResourcesSocket
	}
	if o.Agent == nil {
		o.Agent = AdminAgent{Path: o.Config.AdminSocket}
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&o.HealthInterval, DefaultHealthInterval}, {&o.GCInterval, DefaultGCInterval}, {&o.GCGrace, DefaultGCGrace},
		{&o.RetryInterval, DefaultRetryInterval}, {&o.RequestTimeout, DefaultRequestTimeout}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if o.Registerer == nil {
		o.Registerer = prometheus.NewRegistry()
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	var key Key
	if o.Key != nil {
		key = *o.Key
	} else {
		path := filepath.Join(o.Config.StateDir, KeyFile)
		k, created, err := LoadOrCreateKey(path)
		if err != nil {
			return nil, fmt.Errorf("device plugin: %w", err)
		}
		if created {
			o.Log.Info("Created the node's key of allocation ids", "file", path)
		}
		key = k
	}
	var specs *cdispec.Specs
	if o.CDI {
		s, err := cdispec.New(o.CDISpecDir, o.Config.ResourceName)
		if err != nil {
			return nil, fmt.Errorf("device plugin: %w", err)
		}
		specs = &s
	}
	m, err := newMetrics(o.Registerer)
	if err != nil {
		return nil, fmt.Errorf("device plugin: metrics: %w", err)
	}
	p := &Plugin{opts: o, key: key, n: o.Config.VConnsPerNode, topo: newTopology(o.Config.VConnsPerNode, o.Rails), cdi: specs, log: o.Log, health: newHealth(), metrics: m, sockBase: base, stale: stale, sock: o.SocketName,
		born:    strconv.FormatInt(time.Now().UnixNano(), 36),
		restart: make(chan struct{}, 1), kick: make(chan struct{}, 1), created: make(map[string]time.Time)}
	m.advertised.Set(float64(p.n))
	return p, nil
}

// Restart makes a running plugin stop its server and register again (on
// SIGHUP, say).
func (p *Plugin) Restart() {
	select {
	case p.restart <- struct{}{}:
	default:
	}
}

// Run serves the plugin until ctx ends: health probes, garbage collection,
// the plugin's socket and the kubelet registration, started over whenever
// the kubelet restarts. It returns nil when ctx ends, or an error if it
// cannot start at all.
func (p *Plugin) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.running {
		p.mu.Unlock()
		return errors.New("device plugin: already running")
	}
	p.running = true
	p.mu.Unlock()

	p.removeStaleSockets()
	defer p.removeSocket()
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("device plugin: %w", err)
	}
	defer w.Close()
	if err := w.Add(p.opts.KubeletDir); err != nil {
		return fmt.Errorf("device plugin: watching %s: %w", p.opts.KubeletDir, err)
	}
	if p.opts.PodResources == nil {
		c, err := NewPodResourcesClient(p.opts.PodResourcesSocket)
		if err != nil {
			return fmt.Errorf("device plugin: %w", err)
		}
		defer c.Close()
		p.opts.PodResources = c
	}

	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	// The first ListAndWatch reports the agent's health, not a guess.
	p.updateHealth(ctx)
	wg.Go(func() { p.watchHealth(ctx) })
	wg.Go(func() { p.collectLoop(ctx) })

	for ctx.Err() == nil {
		srv, err := p.start(ctx)
		if err != nil {
			p.metrics.registrations.WithLabelValues("error").Inc()
			p.log.Error(err, "Cannot register with the kubelet; will retry", "in", p.opts.RetryInterval)
			p.waitRetry(ctx, w)
			continue
		}
		p.metrics.registrations.WithLabelValues("ok").Inc()
		p.log.Info("Registered with the kubelet", "resource", p.opts.Config.ResourceName, "devices", p.n,
			"endpoint", p.socketPath())
		reason := p.watch(ctx, w, srv)
		srv.stop()
		if ctx.Err() == nil {
			p.log.Info("Registering again", "reason", reason)
		}
	}
	return nil
}

// pluginServer is one life of the plugin's gRPC server.
type pluginServer struct {
	s      *grpc.Server
	served chan struct{} // closed when Serve returned
	err    error         // Serve's result; set before served is closed
}

func (s *pluginServer) stop() {
	s.s.Stop()
	<-s.served
}

func (p *Plugin) socketPath() string { return filepath.Join(p.opts.KubeletDir, p.sock) }

// nextSocket picks the socket of the next server: a new one in the default
// scheme (see sockBase), after removing the last.
func (p *Plugin) nextSocket() {
	if p.sockBase == "" {
		return
	}
	p.removeSocket()
	p.starts++
	p.sock = fmt.Sprintf("%s-%d-%s-%d.sock", p.sockBase, os.Getpid(), p.born, p.starts)
}

// removeSocket removes the socket served last, if any.
func (p *Plugin) removeSocket() {
	if p.sock == "" || p.sockBase == "" {
		return
	}
	if err := os.Remove(p.socketPath()); err != nil && !errors.Is(err, os.ErrNotExist) {
		p.log.Error(err, "Removing the plugin socket", "socket", p.sock)
	}
}

// removeStaleSockets removes the sockets earlier plugins for the resource
// left in KubeletDir (a killed process removes nothing), as the kubelet's
// plugin watcher asks plugins to: only names this plugin's versions give
// their sockets (p.stale), of a resource in ResourceDomain (New checks it),
// never another plugin's.
func (p *Plugin) removeStaleSockets() {
	if p.stale == nil {
		return
	}
	ents, err := os.ReadDir(p.opts.KubeletDir)
	if err != nil {
		return // Run reports an unreadable directory when it watches it
	}
	for _, e := range ents {
		name := e.Name()
		if e.Type()&os.ModeSocket == 0 || !p.stale.MatchString(name) {
			continue
		}
		if err := os.Remove(filepath.Join(p.opts.KubeletDir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.log.Error(err, "Removing an earlier plugin's socket", "socket", name)
			continue
		}
		p.log.Info("Removed an earlier plugin's socket", "socket", name)
	}
}

func (p *Plugin) kubeletSocket() string { return filepath.Join(p.opts.KubeletDir, "kubelet.sock") }

// start serves the plugin's socket, checks it answers, and registers.
func (p *Plugin) start(ctx context.Context) (_ *pluginServer, err error) {
	p.nextSocket()
	path := p.socketPath()
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("removing the old socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("serving the plugin: %w", err)
	}
	srv := &pluginServer{s: grpc.NewServer(grpc.WaitForHandlers(true)), served: make(chan struct{})}
	pluginapi.RegisterDevicePluginServer(srv.s, &server{p: p})
	go func() {
		srv.err = srv.s.Serve(ln)
		close(srv.served)
	}()
	defer func() {
		if err != nil {
			srv.stop()
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, p.opts.RequestTimeout)
	defer cancel()
	if err := call(path, func(c *grpc.ClientConn) error {
		_, err := pluginapi.NewDevicePluginClient(c).GetDevicePluginOptions(ctx, &pluginapi.Empty{}, grpc.WaitForReady(true))
		return err
	}); err != nil {
		return nil, fmt.Errorf("the plugin's own socket does not answer: %w", err)
	}
	req := &pluginapi.RegisterRequest{Version: pluginapi.Version, Endpoint: p.sock,
		ResourceName: p.opts.Config.ResourceName, Options: p.pluginOptions()}
	// A kubelet socket that exists may not accept yet (it is created
	// at bind, before listen): wait for it, within RequestTimeout.
	_, statErr := os.Stat(p.kubeletSocket())
	if err := call(p.kubeletSocket(), func(c *grpc.ClientConn) error {
		_, err := pluginapi.NewRegistrationClient(c).Register(ctx, req, grpc.WaitForReady(statErr == nil))
		return err
	}); err != nil {
		return nil, fmt.Errorf("registering with the kubelet: %w", err)
	}
	return srv, nil
}

// call makes one connection to a unix socket for f.
func call(path string, f func(*grpc.ClientConn) error) error {
	c, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer c.Close()
	return f(c)
}

// watch waits until the plugin must register again, and says why; it
// returns when ctx ends too.
func (p *Plugin) watch(ctx context.Context, w *fsnotify.Watcher, srv *pluginServer) string {
	for {
		select {
		case <-ctx.Done():
			return "stopping"
		case <-p.restart:
			return "restart requested"
		case <-srv.served:
			return fmt.Sprintf("the server stopped: %v", srv.err)
		case ev, ok := <-w.Events:
			if !ok {
				return "the watcher stopped"
			}
			if r := p.restartFor(ev); r != "" {
				return r
			}
		case err, ok := <-w.Errors:
			if ok {
				p.log.Error(err, "Watching the kubelet directory")
			}
		}
	}
}

// restartFor says why ev needs a new registration, or "".
func (p *Plugin) restartFor(ev fsnotify.Event) string {
	switch {
	case ev.Name == p.kubeletSocket() && ev.Has(fsnotify.Create):
		return "the kubelet socket was created again: the kubelet restarted"
	case ev.Name == p.socketPath() && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)):
		// The plugin removes its own socket when it restarts: only a
		// socket missing now counts.
		if _, err := os.Stat(ev.Name); err != nil {
			return "the plugin socket was removed"
		}
	}
	return ""
}

// waitRetry waits RetryInterval, or less if the kubelet socket appears.
func (p *Plugin) waitRetry(ctx context.Context, w *fsnotify.Watcher) {
	t := time.NewTimer(p.opts.RetryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-p.restart:
			return
		case ev, ok := <-w.Events:
			if !ok {
				return
			}
			if ev.Name == p.kubeletSocket() && ev.Has(fsnotify.Create) {
				return
			}
		case err, ok := <-w.Errors:
			if ok {
				p.log.Error(err, "Watching the kubelet directory")
			}
		}
	}
}
