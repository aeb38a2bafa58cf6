package wire

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// UDP's send side: batches of packets leave with sendmmsg, runs to one
// destination as UDP_SEGMENT (GSO) super-datagrams.

const (
	maxGSOSegs  = 64    // UDP_MAX_SEGMENTS of older kernels
	maxGSOBytes = 65507 // largest UDP payload over IPv4
)

var gsoCtrlSpace = unix.CmsgSpace(2) // UDP_SEGMENT: uint16 segment size

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
		var m int
		i, m = u.pack(pkts, i, gso, &st)
		from, resend, err := u.flush(m, &st)
		if err != nil {
			return from, err
		}
		if resend {
			// Send the refused super-datagram's packets and the rest of
			// this call one by one.
			gso = false
			i = from
		}
	}
	return len(pkts), nil
}

// pack packs pkts[i:] into messages, up to BatchSize packets, a packet
// joining the previous message as a segment where gso allows. It returns
// the index of the first packet it did not take and the number of messages.
func (u *UDP) pack(pkts []Packet, i int, gso bool, st *Stats) (next, m int) {
	t := &u.tx
	for v := 0; i < len(pkts) && v < u.batch; i++ {
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
			// One more segment of the previous message, in the iovec
			// after its last: inline, as this runs for every packet.
			j := m - 1
			t.segs[j]++
			t.bytes[j] += p.N
			t.open[j] = p.N == t.size[j]
			t.msgs[j].Hdr.SetIovlen(t.segs[j])
			if t.segs[j] == 2 {
				t.segment(j)
			}
			v++
			continue
		}
		if !t.setDst(m, p.Addr, u.v4) {
			st.DropUnknown++
			continue
		}
		t.start(m, iv, i, p.N, p.Addr)
		m++
		v++
	}
	return i, m
}

// segment makes message j, which has just become two segments, a UDP_SEGMENT
// super-datagram of segments of its first packet's size.
func (t *udpTx) segment(j int) {
	h := &t.msgs[j].Hdr
	c := t.ctrl[j*gsoCtrlSpace:]
	*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(t.size[j])
	h.Control = &c[0]
	h.SetControllen(unix.CmsgLen(2))
}

// start makes message m carry packet i, of n bytes in iv, to dst; setDst
// has pointed it at dst.
func (t *udpTx) start(m int, iv *unix.Iovec, i, n int, dst verbs.GID) {
	h := &t.msgs[m].Hdr
	h.Iov = iv
	h.SetIovlen(1)
	h.Control = nil
	h.SetControllen(0)
	t.first[m], t.segs[m], t.size[m], t.bytes[m] = i, 1, n, n
	t.open[m], t.dst[m] = true, dst
}

// flush sends messages msgs[:m]; a refused message is dropped and the rest
// go on. When the kernel refuses a super-datagram, flush stops and returns
// resend and the index of its first packet. On a closed or broken socket
// it returns the error and the number of packets consumed before it.
func (u *UDP) flush(m int, st *Stats) (from int, resend bool, err error) {
	t := &u.tx
	for off := 0; off < m; {
		t.off, t.end = off, m
		if err := u.rc.Write(t.fn); err != nil {
			return t.first[off], false, u.wrapErr("sendmmsg", err)
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
			// (EIO, then never again).
			if t.errno == unix.EIO {
				t.gso = false
			}
			return t.first[off], true, nil
		}
		if !countRefused(t.errno, st) {
			return t.first[off], false, u.wrapErr("sendmmsg", t.errno)
		}
		off++ // the kernel refused msgs[off]: skip it
	}
	return 0, false, nil
}

// countRefused counts a single datagram the kernel refused with errno as
// dropped or failed; false if errno means the socket is closed or broken.
func countRefused(errno unix.Errno, st *Stats) bool {
	switch errno {
	case unix.EMSGSIZE:
		st.DropOversize++
	case unix.ENETUNREACH, unix.EHOSTUNREACH, unix.EADDRNOTAVAIL, unix.EAFNOSUPPORT, unix.EINVAL:
		st.DropUnknown++
	case unix.ENOBUFS, unix.ENOMEM, unix.EPERM, unix.EACCES, unix.ECONNREFUSED, unix.EHOSTDOWN, unix.ENETDOWN:
		st.SendErrors++
	default:
		return false
	}
	return true
}

// sendmmsg is the RawConn.Write callback; false means EAGAIN (wait until
// writable).
func (t *udpTx) sendmmsg(fd uintptr) bool {
	n, errno, done := mmsg(unix.SYS_SENDMMSG, fd, &t.msgs[t.off], t.end-t.off)
	if done {
		t.n, t.errno = n, errno
	}
	return done
}
