package metricsauth

import (
	"bufio"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"time"
)

// Listen serves TLS and plain HTTP on ln's one port: a connection whose
// first byte opens a TLS handshake (a record of type 22) is served over
// TLS with the Guard's certificate, any other as plain HTTP, on which Wrap
// answers only the Public paths. So the kubelet's probes stay plain HTTP
// (and stay valid for an agent of the previous release, which the same
// DaemonSet may run during an upgrade), while /metrics needs TLS and
// credentials. Each connection is told apart in a goroutine of its own,
// within sniffTimeout, so a client that sends nothing holds up no other.
func (g *Guard) Listen(ln net.Listener) net.Listener {
	s := &sniffer{Listener: ln, tls: g.TLSConfig(), conns: make(chan net.Conn), done: make(chan struct{})}
	go s.accept()
	return s
}

// sniffTimeout bounds how long a new connection may keep its first byte.
const sniffTimeout = 10 * time.Second

// tlsHandshake is the content type of a TLS handshake record.
const tlsHandshake = 0x16

type sniffer struct {
	net.Listener
	tls   *tls.Config
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	err   error // Accept's error, set before done is closed
}

func (s *sniffer) accept() {
	for {
		c, err := s.Listener.Accept()
		if err != nil {
			s.stop(err)
			return
		}
		go s.sniff(c)
	}
}

// sniff reads c's first byte and hands c to Accept, over TLS or not.
func (s *sniffer) sniff(c net.Conn) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	br := bufio.NewReaderSize(c, 16)
	first, err := br.Peek(1)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		_ = c.Close()
		return
	}
	var conn net.Conn = &peeked{Conn: c, r: br}
	if first[0] == tlsHandshake {
		conn = tls.Server(conn, s.tls)
	}
	select {
	case s.conns <- conn:
	case <-s.done:
		_ = c.Close()
	}
}

func (s *sniffer) Accept() (net.Conn, error) {
	select {
	case c := <-s.conns:
		return c, nil
	case <-s.done:
		return nil, s.err
	}
}

func (s *sniffer) Close() error {
	err := s.Listener.Close()
	s.stop(net.ErrClosed)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return err
	}
	return nil
}

// stop ends Accept with err, the first time.
func (s *sniffer) stop(err error) {
	s.once.Do(func() {
		s.err = err
		close(s.done)
	})
}

// peeked is a connection whose first bytes a reader has buffered.
type peeked struct {
	net.Conn
	r *bufio.Reader
}

func (p *peeked) Read(b []byte) (int, error) { return p.r.Read(b) }
