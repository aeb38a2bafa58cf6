package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// The nfnetlink_queue protocol (linux/netfilter/nfnetlink_queue.h). Its
// numbers are big-endian, unlike the netlink headers around them.
const (
	nfnlSubsysQueue = 3

	nfqnlMsgPacket  = 0
	nfqnlMsgVerdict = 1
	nfqnlMsgConfig  = 2

	nfqaPacketHdr  = 1
	nfqaVerdictHdr = 2

	nfqaCfgCmd      = 1
	nfqaCfgParams   = 2
	nfqaCfgQueueMax = 3
	nfqaCfgMask     = 4
	nfqaCfgFlags    = 5

	nfqnlCfgCmdBind = 1
	nfqnlCopyMeta   = 1
	// A full queue accepts packets rather than dropping them: the tool
	// must not add loss of its own.
	nfqaCfgFFailOpen = 1

	nfDrop   = 0
	nfAccept = 1
)

// queue is one bound NFQUEUE queue.
type queue struct {
	fd  int
	num uint16
	buf []byte
}

// openQueue binds queue num in the calling process's network namespace.
func openQueue(num uint16, maxLen uint32) (*queue, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	q := &queue{fd: fd, num: num, buf: make([]byte, 1<<16)}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		q.close()
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	// A burst must not overflow the socket: packets whose message is lost
	// would wait in the kernel until the queue fills.
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_NO_ENOBUFS, 1)

	cmd := []byte{nfqnlCfgCmdBind, 0, 0, 0} // command, pad, pf (unused by BIND)
	params := make([]byte, 5)
	binary.BigEndian.PutUint32(params, 0) // copy_range: no payload needed
	params[4] = nfqnlCopyMeta
	qmax := binary.BigEndian.AppendUint32(nil, maxLen)
	flags := binary.BigEndian.AppendUint32(nil, nfqaCfgFFailOpen)
	for _, m := range [][]byte{
		attr(nfqaCfgCmd, cmd),
		append(attr(nfqaCfgParams, params), attr(nfqaCfgQueueMax, qmax)...),
		append(attr(nfqaCfgFlags, flags), attr(nfqaCfgMask, flags)...),
	} {
		if err := q.request(nfqnlMsgConfig, m); err != nil {
			q.close()
			if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EBUSY) {
				// The kernel answers EPERM when another socket owns the queue.
				return nil, fmt.Errorf("binding NFQUEUE queue %d: %w (is another process bound to it, or are we not root?)", num, err)
			}
			return nil, fmt.Errorf("binding NFQUEUE queue %d: %w", num, err)
		}
	}
	return q, nil
}

func (q *queue) close() { unix.Close(q.fd) }

// attr encodes one netlink attribute, padded to 4 bytes.
func attr(typ uint16, data []byte) []byte {
	l := 4 + len(data)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[4:], data)
	return b
}

// message encodes a nfnetlink message of the queue subsystem.
func (q *queue) message(typ uint16, flags uint16, attrs []byte) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+4, unix.NLMSG_HDRLEN+4+len(attrs))
	binary.NativeEndian.PutUint32(b[0:], uint32(cap(b)))
	binary.NativeEndian.PutUint16(b[4:], nfnlSubsysQueue<<8|typ)
	binary.NativeEndian.PutUint16(b[6:], unix.NLM_F_REQUEST|flags)
	// nfgenmsg: family AF_UNSPEC, version 0, res_id = the queue.
	binary.BigEndian.PutUint16(b[unix.NLMSG_HDRLEN+2:], q.num)
	return append(b, attrs...)
}

// request sends a message that asks for an ACK and waits for it.
func (q *queue) request(typ uint16, attrs []byte) error {
	if err := unix.Sendto(q.fd, q.message(typ, unix.NLM_F_ACK, attrs), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	for {
		n, _, err := unix.Recvfrom(q.fd, q.buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(q.buf[:n])
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type == unix.NLMSG_ERROR && len(m.Data) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					return unix.Errno(-e)
				}
				return nil
			}
		}
	}
}

// verdict gives one packet its verdict.
func (q *queue) verdict(id uint32, v uint32) error {
	hdr := make([]byte, 8)
	binary.BigEndian.PutUint32(hdr, v)
	binary.BigEndian.PutUint32(hdr[4:], id)
	err := unix.Sendto(q.fd, q.message(nfqnlMsgVerdict, 0, attr(nfqaVerdictHdr, hdr)), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
	if err != nil {
		return fmt.Errorf("verdict for packet %d: %w", id, err)
	}
	return nil
}

// read waits for queued packets and returns their ids, in queue order.
func (q *queue) read() ([]uint32, error) {
	n, _, err := unix.Recvfrom(q.fd, q.buf, 0)
	if err != nil {
		return nil, err
	}
	msgs, err := syscall.ParseNetlinkMessage(q.buf[:n])
	if err != nil {
		return nil, fmt.Errorf("parsing netlink messages: %w", err)
	}
	var ids []uint32
	for _, m := range msgs {
		if m.Header.Type == unix.NLMSG_ERROR {
			if len(m.Data) >= 4 {
				if e := int32(binary.NativeEndian.Uint32(m.Data)); e != 0 {
					fmt.Fprintf(os.Stderr, "impair: netlink error: %v\n", unix.Errno(-e))
				}
			}
			continue
		}
		if m.Header.Type != nfnlSubsysQueue<<8|nfqnlMsgPacket || len(m.Data) < 4 {
			continue
		}
		if id, ok := packetID(m.Data[4:]); ok {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// packetID finds NFQA_PACKET_HDR among a packet message's attributes.
func packetID(b []byte) (uint32, bool) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		typ := binary.NativeEndian.Uint16(b[2:]) & 0x3fff // NLA_TYPE_MASK: without the nested and byte-order flags
		if l < 4 || l > len(b) {
			return 0, false
		}
		if typ == nfqaPacketHdr && l >= 8 {
			return binary.BigEndian.Uint32(b[4:]), true
		}
		b = b[min((l+3)&^3, len(b)):]
	}
	return 0, false
}
