package vconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// Environment variables the device plugin sets in a pod.
const (
	EnvSocket = frame.EnvSocket
	EnvVConns = frame.EnvVConns
)

// Options configure a Client.
type Options struct {
	// Socket is the allocation's socket (default: $RDMAVISOR_SOCKET).
	Socket string
	// VConns is the quota the pod was given (default: $RDMAVISOR_VCONNS);
	// informational: the agent enforces its own record.
	VConns int
	// SharedMemory moves each vconn's messages from the socket to rings in
	// memory shared with the agent (a memfd it passes), where the agent
	// offers them; a vconn stays on the socket if it does not.
	SharedMemory bool
	// Resolver resolves the host names Dial is given that the agent does
	// not know as nodes' (default net.DefaultResolver: cluster DNS).
	Resolver Resolver
}

// OptionsFromEnv reads the options the device plugin put in the
// environment.
func OptionsFromEnv() (Options, error) {
	o := Options{Socket: os.Getenv(EnvSocket)}
	if o.Socket == "" {
		return o, fmt.Errorf("vconn: %s is not set: is the pod allocated an RDMAvisor vconn resource?", EnvSocket)
	}
	if s := os.Getenv(EnvVConns); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			return o, fmt.Errorf("vconn: %s=%q is not a count", EnvVConns, s)
		}
		o.VConns = n
	}
	return o, nil
}

// Client is an application's connection to its node agent. If the agent
// restarts, the vconns of the old connection fail with ErrAgentGone and
// the next Dial or Listen connects again.
type Client struct {
	opts Options

	mu     sync.Mutex
	s      *session // current; replaced when broken; guarded by mu
	closed bool     // guarded by mu
}

// NewClient connects to the agent.
func NewClient(ctx context.Context, o Options) (*Client, error) {
	if o.Socket == "" {
		e, err := OptionsFromEnv()
		if err != nil {
			return nil, err
		}
		o.Socket, o.VConns = e.Socket, max(o.VConns, e.VConns)
	}
	c := &Client{opts: o}
	if _, err := c.session(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

var defaultClient struct {
	mu sync.Mutex
	c  *Client
}

// Default returns the client of the pod's allocation, from the
// environment, connecting on first use.
func Default(ctx context.Context) (*Client, error) {
	defaultClient.mu.Lock()
	defer defaultClient.mu.Unlock()
	if defaultClient.c != nil {
		return defaultClient.c, nil
	}
	c, err := NewClient(ctx, Options{})
	if err != nil {
		return nil, err
	}
	defaultClient.c = c
	return c, nil
}

// Dial connects to a listener at addr ("podIP:port", "service:port",
// "node:port": see Client.Dial) with the default client.
func Dial(ctx context.Context, addr string) (net.Conn, error) {
	c, err := Default(ctx)
	if err != nil {
		return nil, err
	}
	vc, err := c.Dial(ctx, addr)
	if err != nil {
		return nil, err
	}
	return vc, nil
}

// Listen listens at addr (":port": see Client.Listen) with the default
// client.
func Listen(ctx context.Context, addr string) (net.Listener, error) {
	c, err := Default(ctx)
	if err != nil {
		return nil, err
	}
	l, err := c.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return l, nil
}

// session returns the live session, connecting a new one if there is none
// or the last one broke.
func (c *Client) session(ctx context.Context) (*session, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("vconn: client: %w", net.ErrClosed)
	}
	if c.s != nil && c.s.alive() {
		return c.s, nil
	}
	s, err := dialSession(ctx, c.opts.Socket)
	if err != nil {
		return nil, err
	}
	s.wantShm = c.opts.SharedMemory
	c.s = s
	return s, nil
}

// Quota is the number of vconns the agent lets this allocation open.
func (c *Client) Quota(ctx context.Context) (int, error) {
	s, err := c.session(ctx)
	if err != nil {
		return 0, err
	}
	return int(s.info.Quota), nil
}

// Node is the name of the agent's node.
func (c *Client) Node(ctx context.Context) (string, error) {
	s, err := c.session(ctx)
	if err != nil {
		return "", err
	}
	return s.info.Node, nil
}

// Close closes the connection to the agent and with it every vconn and
// listener of this client.
func (c *Client) Close() error {
	c.mu.Lock()
	s := c.s
	c.closed = true
	c.mu.Unlock()
	if s != nil {
		s.shutdown(fmt.Errorf("vconn: client: %w", net.ErrClosed))
	}
	return nil
}

// dial asks the agent for a vconn to addr, as given.
func (c *Client) dial(ctx context.Context, addr string) (*Conn, error) {
	s, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	rep, err := s.call(ctx, &frame.Frame{Op: frame.OpDial, Payload: []byte(addr)})
	if err != nil {
		return nil, fmt.Errorf("vconn: dial %s: %w", addr, err)
	}
	vc := s.newConn(rep.Handle, frame.VConnInfoOf(rep.Arg2), Addr(s.info.Node), Addr(addr))
	if vc == nil {
		return nil, fmt.Errorf("vconn: dial %s: %w", addr, s.failure())
	}
	vc.start(ctx)
	return vc, nil
}

// listen asks the agent for a listener on port; addr is what the
// application asked, for errors.
func (c *Client) listen(ctx context.Context, addr string, p uint16) (*Listener, error) {
	s, err := c.session(ctx)
	if err != nil {
		return nil, err
	}
	rep, err := s.call(ctx, &frame.Frame{Op: frame.OpListen, Arg: uint32(p)})
	if err != nil {
		return nil, fmt.Errorf("vconn: listen %s: %w", addr, err)
	}
	// The agent says where the listener is (its pod's IP); an older one
	// says nothing, and listened on its node.
	bound := Addr(rep.Payload)
	if bound == "" {
		bound = Addr(net.JoinHostPort(s.info.Node, strconv.Itoa(int(p))))
	}
	l := &Listener{s: s, h: rep.Handle, addr: bound, notify: make(chan struct{}, 1)}
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return nil, fmt.Errorf("vconn: listen %s: %w", addr, s.err)
	}
	s.lns[l.h] = l
	s.mu.Unlock()
	return l, nil
}

// session is one connection to the agent.
type session struct {
	conn *net.UnixConn
	info frame.HelloInfo
	done chan struct{} // closed when the session broke

	w frame.Writer // of conn

	mu      sync.Mutex
	nextReq uint32                              // guarded by mu
	pending map[uint32]func(frame.Frame, error) // replies awaited; guarded by mu
	conns   map[uint32]*Conn                    // guarded by mu
	lns     map[uint32]*Listener                // guarded by mu
	err     error                               // why the session broke; guarded by mu

	wantShm  bool           // set before use: try shared memory for each vconn
	features frame.Features // what the agent offers (Hello); set before use
	rights   []int          // descriptors of the frame being dispatched; reader-owned
}

func dialSession(ctx context.Context, path string) (*session, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, noAgent(path, err)
	}
	uc := nc.(*net.UnixConn)
	s := &session{conn: uc, w: frame.Writer{Conn: uc}, done: make(chan struct{}),
		pending: make(map[uint32]func(frame.Frame, error)), conns: make(map[uint32]*Conn), lns: make(map[uint32]*Listener)}
	go s.read()
	rep, err := s.call(ctx, &frame.Frame{Op: frame.OpHello, Arg: frame.Version})
	if err != nil {
		s.shutdown(err)
		return nil, fmt.Errorf("vconn: hello: %w", err)
	}
	if rep.Arg != frame.Version {
		// An agent speaking another version would read our frames
		// otherwise than we mean them (docs/protocol.md).
		err := fmt.Errorf("vconn: hello: the agent speaks protocol version %d, this client %d", rep.Arg, frame.Version)
		s.shutdown(err)
		return nil, err
	}
	if s.info, err = frame.DecodeHello(rep.Payload); err != nil {
		s.shutdown(err)
		return nil, fmt.Errorf("vconn: hello: %w", err)
	}
	s.features = frame.Features(rep.Arg2)
	return s, nil
}

func (s *session) alive() bool {
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

func (s *session) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	return ErrAgentGone
}

// write writes f; a socket that fails ends the session.
func (s *session) write(f *frame.Frame) error {
	err := s.w.Write(f)
	if err == nil || errors.Is(err, frame.ErrTooBig) {
		return err
	}
	s.shutdown(&Error{Code: CodeAgentGone, Message: err.Error()})
	return s.failure()
}

// async sends a request; cb gets the reply (or the session's failure) on
// the reader goroutine and must not block.
func (s *session) async(f *frame.Frame, cb func(frame.Frame, error)) error {
	s.mu.Lock()
	if s.err != nil {
		err := s.err
		s.mu.Unlock()
		return err
	}
	s.nextReq++
	if s.nextReq == 0 {
		s.nextReq++
	}
	f.Req = s.nextReq
	s.pending[f.Req] = cb
	s.mu.Unlock()
	if err := s.write(f); err != nil {
		s.mu.Lock()
		_, mine := s.pending[f.Req]
		delete(s.pending, f.Req)
		s.mu.Unlock()
		if mine {
			return err
		}
		return nil // the failure was already delivered to cb
	}
	return nil
}

// call sends a request and waits for its reply.
func (s *session) call(ctx context.Context, f *frame.Frame) (frame.Frame, error) {
	type result struct {
		f   frame.Frame
		err error
	}
	ch := make(chan result, 1)
	if err := s.async(f, func(r frame.Frame, err error) { ch <- result{r, err} }); err != nil {
		return frame.Frame{}, err
	}
	req := f.Req
	select {
	case r := <-ch:
		return r.f, r.err
	case <-ctx.Done():
		s.mu.Lock()
		delete(s.pending, req)
		s.mu.Unlock()
		return frame.Frame{}, ctx.Err()
	}
}

// read dispatches the agent's frames until the connection ends.
func (s *session) read() {
	buf := make([]byte, frame.MaxFrame+1)
	oob := make([]byte, shm.RightsSpace)
	for {
		n, oobn, _, _, err := s.conn.ReadMsgUnix(buf, oob)
		if oobn > 0 { // OpShm's reply; a callback takes them, or they close below
			s.rights, _ = shm.ParseRights(oob[:oobn])
		}
		if err != nil || n == 0 {
			shm.CloseFDs(s.rights)
			msg := "connection closed"
			if err != nil {
				msg = err.Error()
			}
			s.shutdown(&Error{Code: CodeAgentGone, Message: msg})
			return
		}
		f, err := frame.Decode(buf[:n])
		if err != nil {
			shm.CloseFDs(s.rights)
			s.shutdown(&Error{Code: CodeAgentGone, Message: "protocol error: " + err.Error()})
			return
		}
		f.Payload = append([]byte(nil), f.Payload...)
		s.dispatch(f)
		shm.CloseFDs(s.rights)
		s.rights = nil
	}
}

func (s *session) dispatch(f frame.Frame) {
	if f.Op == frame.OpError && f.Req == 0 && f.Handle == 0 {
		// The agent's last frame (docs/protocol.md §3, §8): it ends
		// the session, whether or not its close has come yet.
		s.shutdown(&Error{Code: CodeAgentGone, Message: fmt.Sprintf("the agent ended the session: %v: %s", frame.Code(f.Arg), f.Payload)})
		return
	}
	if f.Req != 0 && (f.Op == frame.OpOK || f.Op == frame.OpError) {
		s.mu.Lock()
		cb := s.pending[f.Req]
		delete(s.pending, f.Req)
		s.mu.Unlock()
		if cb != nil {
			cb(f, errOf(&f))
		}
		return
	}
	switch f.Op {
	case frame.OpData, frame.OpEOF, frame.OpError:
		s.mu.Lock()
		c := s.conns[f.Handle]
		s.mu.Unlock()
		if c != nil {
			c.deliver(f)
		}
	case frame.OpAccept:
		s.mu.Lock()
		l := s.lns[f.Handle]
		s.mu.Unlock()
		if l == nil {
			return
		}
		c := s.newConn(f.Arg, frame.VConnInfoOf(f.Arg2), Addr(l.addr), Addr(f.Payload))
		if c == nil {
			return
		}
		if s.wantShm {
			// Negotiation waits for a reply on this goroutine's socket:
			// the listener gets the vconn once it is done.
			go func() {
				c.start(context.Background())
				l.push(c)
			}()
			return
		}
		go c.grantInitial()
		l.push(c)
	}
}

// newConn registers a vconn handle; nil if the session broke.
func (s *session) newConn(h uint32, info frame.VConnInfo, local, remote Addr) *Conn {
	c := &Conn{s: s, h: h, info: info, local: local, remote: remote, notify: make(chan struct{}, 1),
		sem: make(chan struct{}, max(1, int(s.info.SendWindow))), rd: newDeadline(), wd: newDeadline(), closing: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil
	}
	s.conns[h] = c
	return c
}

// shutdown breaks the session with err: every waiter and vconn fails.
func (s *session) shutdown(err error) {
	s.mu.Lock()
	if s.err != nil {
		s.mu.Unlock()
		return
	}
	s.err = err
	pending := s.pending
	conns := s.conns
	lns := s.lns
	s.pending, s.conns, s.lns = map[uint32]func(frame.Frame, error){}, map[uint32]*Conn{}, map[uint32]*Listener{}
	var shms []*shmConn
	for _, c := range conns {
		if c.shm != nil { // set under mu (openShm)
			shms = append(shms, c.shm)
		}
	}
	s.mu.Unlock()
	close(s.done)
	_ = s.conn.Close()
	for _, cb := range pending {
		cb(frame.Frame{}, err)
	}
	for _, c := range conns {
		c.fail(err)
		c.unmapRegions(err)
	}
	for _, x := range shms { // unmapped now: the application may never Close
		go x.close()
	}
	for _, l := range lns {
		l.fail(err)
	}
}
