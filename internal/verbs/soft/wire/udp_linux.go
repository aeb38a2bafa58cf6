package wire

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

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

	tx udpTx
	rx udpRx
}

var _ Wire = (*UDP)(nil)

const (
	maxGSOSegs  = 64    // UDP_MAX_SEGMENTS of older kernels
	maxGSOBytes = 65507 // largest UDP payload over IPv4
	groSlots    = 16    // staging buffers for coalesced receives
	groSlotLen  = 1 << 16
)

var (
	gsoCtrlSpace = unix.CmsgSpace(2)     // UDP_SEGMENT: uint16 segment size
	rxCtrlSpace  = 2 * unix.CmsgSpace(4) // SO_RXQ_OVFL and UDP_GRO: 32 bits each
)

// udpTx is the send side, guarded by mu. Message m carries segs[m] packets
// from pkts[first[m]] on, in consecutive iovecs, to dst[m].
type udpTx struct {
	mu    sync.Mutex
	gso   bool
	msgs  []unix.Mmsghdr
	iov   []unix.Iovec
	name4 []unix.RawSockaddrInet4
	name6 []unix.RawSockaddrInet6
	ctrl  []byte // one UDP_SEGMENT control message per message
	first []int
	segs  []int
	size  []int // segment size: the first packet's length
	bytes []int
	open  []bool // false once a shorter (final) segment joined
	dst   []verbs.GID

	off, end int        // sendmmsg's arguments: msgs[off:end]
	n        int        // its result
	errno    unix.Errno // its error, for msgs[off]
	fn       func(uintptr) bool
}

// udpRx is the receive side, guarded by mu. With GRO, messages land in
// stage, and the segments not yet handed out are pending: message pmsg
// from offset poff, up to message pn.
type udpRx struct {
	mu    sync.Mutex
	gro   bool
	msgs  []unix.Mmsghdr
	iov   []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	ctrl  []byte
	ovfl  uint32 // the socket's drop count when last seen
	stage []byte
	seg   []int // GRO segment size per message (0: a single datagram)

	pmsg, pn, poff int

	k     int
	n     int
	errno unix.Errno
	fn    func(uintptr) bool
}

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

func (u *UDP) initTx(port uint16, gso bool) {
	t := &u.tx
	n := u.batch
	t.gso = gso
	t.msgs = make([]unix.Mmsghdr, n)
	t.iov = make([]unix.Iovec, n)
	t.ctrl = make([]byte, n*gsoCtrlSpace)
	t.first, t.segs, t.size, t.bytes = make([]int, n), make([]int, n), make([]int, n), make([]int, n)
	t.open = make([]bool, n)
	t.dst = make([]verbs.GID, n)
	if u.v4 {
		t.name4 = make([]unix.RawSockaddrInet4, n)
	} else {
		t.name6 = make([]unix.RawSockaddrInet6, n)
	}
	for m := range n {
		h := &t.msgs[m].Hdr
		if u.v4 {
			sa := &t.name4[m]
			sa.Family = unix.AF_INET
			putPort(&sa.Port, port)
			h.Name = (*byte)(unsafe.Pointer(sa))
			h.Namelen = unix.SizeofSockaddrInet4
		} else {
			sa := &t.name6[m]
			sa.Family = unix.AF_INET6
			putPort(&sa.Port, port)
			h.Name = (*byte)(unsafe.Pointer(sa))
			h.Namelen = unix.SizeofSockaddrInet6
		}
		c := (*unix.Cmsghdr)(unsafe.Pointer(&t.ctrl[m*gsoCtrlSpace]))
		c.Level, c.Type = unix.SOL_UDP, unix.UDP_SEGMENT
		c.SetLen(unix.CmsgLen(2))
	}
	t.fn = t.sendmmsg
}

func (u *UDP) initRx(gro bool) {
	r := &u.rx
	n := u.batch
	r.gro = gro
	if gro {
		n = min(n, groSlots)
		r.stage = make([]byte, n*groSlotLen)
		r.seg = make([]int, n)
	}
	r.msgs = make([]unix.Mmsghdr, n)
	r.iov = make([]unix.Iovec, n)
	r.names = make([]unix.RawSockaddrInet6, n)
	r.ctrl = make([]byte, n*rxCtrlSpace)
	for k := range n {
		h := &r.msgs[k].Hdr
		h.Name = (*byte)(unsafe.Pointer(&r.names[k]))
		h.Iov = &r.iov[k]
		h.SetIovlen(1)
		h.Control = &r.ctrl[k*rxCtrlSpace]
		if gro {
			r.iov[k].Base = &r.stage[k*groSlotLen]
			r.iov[k].SetLen(groSlotLen)
		}
	}
	r.fn = r.recvmmsg
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

// SocketBuffers reports SO_RCVBUF and SO_SNDBUF as the kernel set them.
func (u *UDP) SocketBuffers() (read, write int) { return u.rbuf, u.wbuf }

func (u *UDP) Stats() Stats { return u.cnt.snapshot() }

// Close closes the socket, unblocking Recv. It is idempotent.
func (u *UDP) Close() error {
	if u.closed.Swap(true) {
		return nil
	}
	return u.conn.Close()
}

func (u *UDP) wrapErr(op string, err error) error {
	if u.closed.Load() || errors.Is(err, net.ErrClosed) {
		return errClosed
	}
	return fmt.Errorf("wire: udp %v: %s: %w", u.local, op, err)
}

// setDst points message m at gid; false if this socket cannot reach it.
func (t *udpTx) setDst(m int, gid verbs.GID, v4 bool) bool {
	mapped := gid[10] == 0xff && gid[11] == 0xff && [10]byte(gid[:10]) == [10]byte{}
	if v4 {
		if !mapped {
			return false
		}
		t.name4[m].Addr = [4]byte(gid[12:])
		return true
	}
	if mapped { // an IPv6 socket is IPV6_V6ONLY
		return false
	}
	t.name6[m].Addr = gid
	return true
}

// joins reports whether a packet of n bytes to dst can be one more segment
// of message m.
func (t *udpTx) joins(m int, dst verbs.GID, n int) bool {
	return t.open[m] && n > 0 && n <= t.size[m] && t.dst[m] == dst &&
		t.segs[m] < maxGSOSegs && t.bytes[m]+n <= maxGSOBytes
}

// Send transmits pkts, batch by batch. Packets the kernel refuses for their
// size (EMSGSIZE) or destination are dropped and counted; an error is
// returned only for a closed or broken socket, with the number of packets
// consumed before it.
func (u *UDP) Send(pkts []Packet) (int, error) {
	t := &u.tx
	t.mu.Lock()
	defer t.mu.Unlock()
	if u.closed.Load() {
		return 0, errClosed
	}
	var st Stats
	defer u.cnt.add(&st)
	defer clear(t.iov) // the buffers are the caller's again
	gso := t.gso
	for i := 0; i < len(pkts); {
		// Pack up to BatchSize packets into messages.
		m, v := 0, 0
		for ; i < len(pkts) && v < u.batch; i++ {
			p := &pkts[i]
			data := p.Buf[:p.N]
			if p.N > MaxPacketLen {
				st.DropOversize++
				continue
			}
			iv := &t.iov[v]
			iv.Base = nil
			if len(data) > 0 {
				iv.Base = &data[0]
			}
			iv.SetLen(len(data))
			if gso && m > 0 && t.joins(m-1, p.Addr, p.N) {
				j := m - 1
				t.segs[j]++
				t.bytes[j] += p.N
				t.open[j] = p.N == t.size[j]
				h := &t.msgs[j].Hdr
				h.SetIovlen(t.segs[j])
				if t.segs[j] == 2 {
					c := t.ctrl[j*gsoCtrlSpace:]
					*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(t.size[j])
					h.Control = &c[0]
					h.SetControllen(unix.CmsgLen(2))
				}
				v++
				continue
			}
			if !t.setDst(m, p.Addr, u.v4) {
				st.DropUnknown++
				continue
			}
			h := &t.msgs[m].Hdr
			h.Iov = iv
			h.SetIovlen(1)
			h.Control = nil
			h.SetControllen(0)
			t.first[m], t.segs[m], t.size[m], t.bytes[m] = i, 1, p.N, p.N
			t.open[m], t.dst[m] = true, p.Addr
			m++
			v++
		}
		// Send them; a refused message is dropped and the rest go on.
		for off := 0; off < m; {
			t.off, t.end = off, m
			if err := u.rc.Write(t.fn); err != nil {
				return t.first[off], u.wrapErr("sendmmsg", err)
			}
			if t.errno == 0 {
				for j := off; j < off+t.n; j++ {
					st.TxPackets += uint64(t.segs[j])
					st.TxBytes += uint64(t.bytes[j])
				}
				off += t.n
				continue
			}
			if t.segs[off] > 1 {
				// A super-datagram was refused: a segment too big for the
				// path (EINVAL, EMSGSIZE) or no offload on this route
				// (EIO, then never again). Send its packets and the rest
				// of this call one by one.
				if t.errno == unix.EIO {
					t.gso = false
				}
				gso = false
				i = t.first[off]
				break
			}
			switch t.errno {
			case unix.EMSGSIZE:
				st.DropOversize++
			case unix.ENETUNREACH, unix.EHOSTUNREACH, unix.EADDRNOTAVAIL, unix.EAFNOSUPPORT, unix.EINVAL:
				st.DropUnknown++
			case unix.ENOBUFS, unix.ENOMEM, unix.EPERM, unix.EACCES, unix.ECONNREFUSED, unix.EHOSTDOWN, unix.ENETDOWN:
				st.SendErrors++
			default:
				return t.first[off], u.wrapErr("sendmmsg", t.errno)
			}
			off++ // the kernel refused msgs[off]: skip it
		}
	}
	return len(pkts), nil
}

// sendmmsg is the RawConn.Write callback; false means EAGAIN (wait until
// writable).
func (t *udpTx) sendmmsg(fd uintptr) bool {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_SENDMMSG, fd,
			uintptr(unsafe.Pointer(&t.msgs[t.off])), uintptr(t.end-t.off), 0, 0, 0)
		switch errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		t.n, t.errno = int(n), errno
		return true
	}
}

// recvmmsg is the RawConn.Read callback; false means EAGAIN.
func (r *udpRx) recvmmsg(fd uintptr) bool {
	for {
		n, _, errno := unix.Syscall6(unix.SYS_RECVMMSG, fd,
			uintptr(unsafe.Pointer(&r.msgs[0])), uintptr(r.k), 0, 0, 0)
		switch errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		r.n, r.errno = int(n), errno
		return true
	}
}

// Recv receives up to len(pkts) packets. Truncated datagrams are dropped
// and counted; if a batch held only those, Recv waits for more.
func (u *UDP) Recv(pkts []Packet) (int, error) {
	r := &u.rx
	r.mu.Lock()
	defer r.mu.Unlock()
	if u.closed.Load() {
		return 0, errClosed
	}
	if len(pkts) == 0 {
		return 0, nil
	}
	if r.gro {
		return u.recvStaged(pkts)
	}
	return u.recvDirect(pkts)
}

// recv runs recvmmsg on the first k messages and reads their control
// messages; it returns how many arrived.
func (u *UDP) recv(k int, st *Stats) (int, error) {
	r := &u.rx
	for i := range k {
		h := &r.msgs[i].Hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(rxCtrlSpace)
		h.Flags = 0
	}
	r.k = k
	if err := u.rc.Read(r.fn); err != nil {
		return 0, u.wrapErr("recvmmsg", err)
	}
	if r.errno != 0 {
		return 0, u.wrapErr("recvmmsg", r.errno)
	}
	for i := range r.n {
		if r.seg != nil {
			r.seg[i] = 0
		}
		if r.msgs[i].Hdr.Controllen > 0 {
			r.readCtrl(i, st)
		}
	}
	return r.n, nil
}

// recvDirect receives straight into the callers' buffers, at most
// BatchSize packets.
func (u *UDP) recvDirect(pkts []Packet) (int, error) {
	r := &u.rx
	k := min(len(pkts), len(r.msgs))
	for i := range k {
		b := pkts[i].Buf
		v := &r.iov[i]
		v.Base = nil
		if len(b) > 0 {
			v.Base = &b[0]
		}
		v.SetLen(len(b))
	}
	defer clear(r.iov[:k])
	for {
		var st Stats
		n, err := u.recv(k, &st)
		if err != nil {
			return 0, err
		}
		j := 0
		for i := range n {
			m := &r.msgs[i]
			size := int(m.Len)
			if m.Hdr.Flags&unix.MSG_TRUNC != 0 || size > len(pkts[j].Buf) {
				st.DropTruncated++
				continue
			}
			if j != i { // an earlier one was truncated: close the gap
				copy(pkts[j].Buf, pkts[i].Buf[:size])
			}
			pkts[j].N = size
			pkts[j].Addr = gidOf(&r.names[i])
			st.RxPackets++
			st.RxBytes += uint64(size)
			j++
		}
		u.cnt.add(&st)
		if j > 0 {
			return j, nil
		}
	}
}

// recvStaged receives into the staging area and splits coalesced messages
// into their segments; what does not fit in pkts waits for the next call.
func (u *UDP) recvStaged(pkts []Packet) (int, error) {
	r := &u.rx
	for {
		var st Stats
		if r.pmsg == r.pn {
			n, err := u.recv(len(r.msgs), &st)
			if err != nil {
				return 0, err
			}
			r.pmsg, r.pn, r.poff = 0, n, 0
		}
		j := 0
		for j < len(pkts) && r.pmsg < r.pn {
			i := r.pmsg
			m := &r.msgs[i]
			total := int(m.Len)
			if m.Hdr.Flags&unix.MSG_TRUNC != 0 {
				st.DropTruncated++
				r.pmsg++
				continue
			}
			size := total - r.poff
			if seg := r.seg[i]; seg > 0 {
				size = min(size, seg)
			}
			if p := &pkts[j]; size > len(p.Buf) {
				st.DropTruncated++
			} else {
				off := i*groSlotLen + r.poff
				copy(p.Buf, r.stage[off:off+size])
				p.N, p.Addr = size, gidOf(&r.names[i])
				st.RxPackets++
				st.RxBytes += uint64(size)
				j++
			}
			r.poff += size
			if r.poff >= total {
				r.pmsg++
				r.poff = 0
			}
		}
		u.cnt.add(&st)
		if j > 0 {
			return j, nil
		}
	}
}

// readCtrl reads message i's control messages: SO_RXQ_OVFL, the socket's
// cumulative drop count (what is new is counted), and UDP_GRO, the segment
// size of a coalesced message.
func (r *udpRx) readCtrl(i int, st *Stats) {
	c := r.ctrl[i*rxCtrlSpace : i*rxCtrlSpace+int(r.msgs[i].Hdr.Controllen)]
	for len(c) >= unix.CmsgLen(0) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		if int(h.Len) < unix.CmsgLen(0) || int(h.Len) > len(c) {
			return
		}
		if int(h.Len) >= unix.CmsgLen(4) {
			v := *(*uint32)(unsafe.Pointer(&c[unix.CmsgLen(0)]))
			switch {
			case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL:
				st.DropQueueFull += uint64(v - r.ovfl)
				r.ovfl = v
			case h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && r.seg != nil:
				r.seg[i] = int(v)
			}
		}
		next := unix.CmsgSpace(int(h.Len) - unix.CmsgLen(0))
		if next >= len(c) {
			return
		}
		c = c[next:]
	}
}

// gidOf reads the source address the kernel wrote: sockaddr_in or
// sockaddr_in6.
func gidOf(sa *unix.RawSockaddrInet6) verbs.GID {
	if sa.Family == unix.AF_INET {
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return verbs.GID{10: 0xff, 11: 0xff, 12: sa4.Addr[0], 13: sa4.Addr[1], 14: sa4.Addr[2], 15: sa4.Addr[3]}
	}
	return verbs.GID(sa.Addr)
}
