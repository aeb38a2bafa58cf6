package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// The socket and its setup. The send side (sendmmsg, GSO) is in
// udp_send_linux.go, the receive side (recvmmsg, GRO) in udp_recv_linux.go.

// UDP is a Wire over one UDP socket, the way RoCEv2 travels: the socket is
// bound to (Addr, Port) and a packet for GID g goes to (g, Port). Packets
// move in batches with sendmmsg and recvmmsg on message headers allocated
// once, so Send and Recv allocate nothing.
//
// Send is zero-copy: the kernel reads the callers' buffers. With offload
// (the default where the kernel supports it), a run of packets to one
// destination that all have the size of the first (the last may be
// shorter) leaves as one UDP_SEGMENT super-datagram, and the socket asks
// for UDP_GRO: the kernel hands over coalesced runs, which Recv splits from
// a staging area into the callers' buffers (one copy). Without offload,
// Recv is zero-copy too.
//
// IPv4 sockets set IP_PMTUDISC_DO (IPv6: IPV6_PMTUDISC_DO): a packet larger
// than the path MTU is refused by the kernel and counted in
// Stats.DropOversize, never fragmented. Socket buffer overflow is read from
// SO_RXQ_OVFL into Stats.DropQueueFull; the kernel reports it with the next
// packet it queues, so drops show once traffic resumes.
//
// Send and Recv are each serialised by a lock of their own and run
// concurrently with each other. Close unblocks Recv.
type UDP struct {
	conn  *net.UDPConn
	rc    syscall.RawConn
	gid   verbs.GID
	local netip.AddrPort
	v4    bool
	batch int
	rbuf  int // SO_RCVBUF as the kernel reports it
	wbuf  int // SO_SNDBUF as the kernel reports it

	cnt    counters
	closed atomic.Bool
	// link watches the interface holding the bind address (PortState).
	link *link

	tx udpTx
	rx udpRx
}

var _ Wire = (*UDP)(nil)

// ListenUDP opens a UDP wire bound to (cfg.Addr, cfg.Port).
func ListenUDP(cfg UDPConfig) (*UDP, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	v4 := cfg.Addr.Is4()
	network := "udp6"
	if v4 {
		network = "udp4"
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) { serr = setSockopts(int(fd), v4, cfg) }); err != nil {
			return err
		}
		return serr
	}}
	local := netip.AddrPortFrom(cfg.Addr, cfg.Port)
	pc, err := lc.ListenPacket(context.Background(), network, local.String())
	if err != nil {
		return nil, fmt.Errorf("wire: listen udp %v: %w", local, err)
	}
	conn := pc.(*net.UDPConn)
	rc, err := conn.SyscallConn()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("wire: listen udp %v: %w", local, err)
	}
	u := &UDP{
		conn:  conn,
		rc:    rc,
		gid:   verbs.GIDFromAddr(cfg.Addr),
		local: local,
		v4:    v4,
		batch: cfg.BatchSize,
	}
	if err := rc.Control(func(fd uintptr) {
		u.rbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		u.wbuf, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF)
	}); err != nil {
		conn.Close()
		return nil, fmt.Errorf("wire: listen udp %v: %w", local, err)
	}
	var gso, gro bool
	if !cfg.NoOffload {
		rc.Control(func(fd uintptr) {
			// Segmentation only on loopback: where the kernel (or a NIC)
			// cuts a super-datagram it numbers the segments' IPv4 IDs,
			// and the ICRC covers the ID (package roce assumes 0, as an
			// unsegmented DF datagram from an unconnected socket has).
			if local.Addr().IsLoopback() {
				_, err := unix.GetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_SEGMENT)
				gso = err == nil
			}
			gro = unix.SetsockoptInt(int(fd), unix.IPPROTO_UDP, unix.UDP_GRO, 1) == nil
		})
	}
	if v4 && !gso {
		// No UDP checksum, as rxe sends RoCEv2 (prepare_udp_hdr: check =
		// 0): the ICRC covers the packet. UDP_SEGMENT refuses sockets
		// without checksums, so loopback with segmentation keeps it.
		rc.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_NO_CHECK, 1) })
	}
	if u.link, err = newLink(cfg.Addr); err != nil {
		conn.Close()
		return nil, err
	}
	u.initTx(cfg.Port, gso)
	u.initRx(gro)
	return u, nil
}

func setSockopts(fd int, v4 bool, cfg UDPConfig) error {
	setBuf := func(force, plain, size int) {
		if size <= 0 {
			return
		}
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, force, size) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, plain, size) // capped at the sysctl maximum
		}
	}
	setBuf(unix.SO_RCVBUFFORCE, unix.SO_RCVBUF, cfg.ReadBuffer)
	setBuf(unix.SO_SNDBUFFORCE, unix.SO_SNDBUF, cfg.WriteBuffer)
	var err error
	if v4 {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	} else {
		err = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IPV6_PMTUDISC_DO)
	}
	if err != nil {
		return fmt.Errorf("set don't-fragment: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); err != nil {
		return fmt.Errorf("set SO_RXQ_OVFL: %w", err)
	}
	return nil
}

// Offload reports whether the socket sends with UDP_SEGMENT and receives
// with UDP_GRO.
func (u *UDP) Offload() (gso, gro bool) {
	u.tx.mu.Lock()
	gso = u.tx.gso
	u.tx.mu.Unlock()
	return gso, u.rx.gro
}

// putPort stores port in network byte order.
func putPort(p *uint16, port uint16) {
	b := (*[2]byte)(unsafe.Pointer(p))
	b[0], b[1] = byte(port>>8), byte(port)
}

// LocalGID is the GID of the bound address.
func (u *UDP) LocalGID() verbs.GID { return u.gid }

// LocalAddr is the bound address and port.
func (u *UDP) LocalAddr() netip.AddrPort { return u.local }

// Port is the bound port: the port every device of the network sends from
// and to, which the device covers with the ICRC (soft.Config.Port).
func (u *UDP) Port() uint16 { return u.local.Port() }

// SocketBuffers reports SO_RCVBUF and SO_SNDBUF as the kernel set them.
func (u *UDP) SocketBuffers() (read, write int) { return u.rbuf, u.wbuf }

func (u *UDP) Stats() Stats { return u.cnt.snapshot() }

// Close closes the socket, unblocking Recv. It is idempotent.
func (u *UDP) Close() error {
	if u.closed.Swap(true) {
		return nil
	}
	u.link.close()
	return u.conn.Close()
}

// PortState is what rxe would report for a port on the bind address's
// netdev: DOWN once no interface that is up and running holds the
// address (the link went down, lost carrier, or lost the address),
// ACTIVE otherwise.
func (u *UDP) PortState() (verbs.PortState, error) {
	if u.closed.Load() {
		return 0, errClosed
	}
	st, err := u.link.state()
	if err != nil {
		return 0, u.wrapErr("port state", err)
	}
	return st, nil
}

func (u *UDP) wrapErr(op string, err error) error {
	if u.closed.Load() || errors.Is(err, net.ErrClosed) {
		return errClosed
	}
	return fmt.Errorf("wire: udp %v: %s: %w", u.local, op, err)
}

// mmsg runs sendmmsg or recvmmsg (trap) on the k messages from msgs,
// again on EINTR. done is false on EAGAIN, for the RawConn callbacks to
// wait; otherwise n and errno are the call's.
func mmsg(trap, fd uintptr, msgs *unix.Mmsghdr, k int) (n int, errno unix.Errno, done bool) {
	for {
		r, _, e := unix.Syscall6(trap, fd, uintptr(unsafe.Pointer(msgs)), uintptr(k), 0, 0, 0)
		switch e {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, 0, false
		}
		return int(r), e, true
	}
}
