package wire

import (
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// UDP's receive side: batches arrive with recvmmsg, straight into the
// callers' buffers, or with UDP_GRO into a staging area they are split from.

const (
	groSlots   = 16 // staging buffers for coalesced receives
	groSlotLen = 1 << 16
)

var rxCtrlSpace = 2 * unix.CmsgSpace(4) // SO_RXQ_OVFL and UDP_GRO: 32 bits each

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

// recvmmsg is the RawConn.Read callback; false means EAGAIN.
func (r *udpRx) recvmmsg(fd uintptr) bool {
	n, errno, done := mmsg(unix.SYS_RECVMMSG, fd, &r.msgs[0], r.k)
	if done {
		r.n, r.errno = n, errno
	}
	return done
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
			pkts[j].Addr, pkts[j].Port = gidOf(&r.names[i]), portOf(&r.names[i])
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
				p.N, p.Addr, p.Port = size, gidOf(&r.names[i]), portOf(&r.names[i])
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

// portOf reads the source port the kernel wrote, in network order in
// sockaddr_in and sockaddr_in6 alike.
func portOf(sa *unix.RawSockaddrInet6) uint16 {
	b := (*[2]byte)(unsafe.Pointer(&sa.Port))
	return uint16(b[0])<<8 | uint16(b[1])
}
