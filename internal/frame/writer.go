package frame

import (
	"net"
	"sync"
)

// Writer writes frames to one end of a pod protocol socket, the agent's or
// the application's: one frame a datagram (SOCK_SEQPACKET), from any
// goroutine, in the order the writes take its lock. It encodes each frame
// into a buffer it keeps and reuses, so once that buffer has grown to the
// session's largest frame a write allocates nothing and copies the payload
// once, into the datagram.
type Writer struct {
	// Conn is the socket; set before the first write.
	Conn *net.UnixConn

	mu  sync.Mutex // serialises writes; guards buf
	buf []byte
}

// Write writes f as one datagram. It fails with ErrTooBig, writing
// nothing, when f's payload is larger than MaxPayload, or with the
// socket's error.
func (w *Writer) Write(f *Frame) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if w.buf, err = Append(w.buf[:0], f); err != nil {
		return err
	}
	_, err = w.Conn.Write(w.buf)
	return err
}

// WriteMsg is Write with oob as the datagram's ancillary data (SCM_RIGHTS
// descriptors: shm.Rights).
func (w *Writer) WriteMsg(f *Frame, oob []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if w.buf, err = Append(w.buf[:0], f); err != nil {
		return err
	}
	_, _, err = w.Conn.WriteMsgUnix(w.buf, oob, nil)
	return err
}
