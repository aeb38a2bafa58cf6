// Package ladderproto is benchmark E6's protocol (clib/test/ladder.h) in Go:
// what the ladder's Go paths speak, in the test's process (test/ladder)
// and in a process of their own (test/ladder/goladder), as a pod's
// program would.
package ladderproto

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// The protocol of clib/test/ladder.h, which every path's client and server
// speak: a 16-byte header (op, size: u32; count: u64; little-endian), then
// count messages of size bytes, echoed (OpEcho) or counted and checked by
// their number (OpSink, answered with 16 bytes: the bytes read and the
// messages misnumbered).
const (
	OpEcho = 1
	OpSink = 2
	OpQuit = 3
	MaxMsg = 64 << 10
)

// Conn is one end of a path's connection: put sends one message, get
// receives one of exactly len(b) bytes into b (io.EOF when the peer hung
// up before it). On a byte stream, a message is len(b) bytes of it.
type Conn interface {
	Put(b []byte) error
	Get(b []byte) error
}

// Header is a request: op, and count messages of size bytes.
func Header(op, size uint32, count uint64) []byte {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, op)
	binary.LittleEndian.PutUint32(h[4:], size)
	binary.LittleEndian.PutUint64(h[8:], count)
	return h
}

// Fill writes message seq of an echo: its number, then bytes that depend
// on it and on their place (ladder.h's ladder_fill).
func Fill(b []byte, seq uint64) {
	binary.LittleEndian.PutUint64(b, seq)
	for i := 8; i < len(b); i++ {
		b[i] = byte(seq*7 + uint64(i))
	}
}

// Serve answers one client until it quits or hangs up.
func Serve(c Conn) error {
	h := make([]byte, 16)
	buf := make([]byte, MaxMsg)
	for {
		if err := c.Get(h); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		op, size, count := binary.LittleEndian.Uint32(h), binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint64(h[8:])
		if op == OpQuit {
			return nil
		}
		if size < 8 || size > MaxMsg || (op != OpEcho && op != OpSink) {
			return fmt.Errorf("bad header %x", h)
		}
		m := buf[:size]
		var wrong uint64
		for i := uint64(0); i < count; i++ {
			if err := c.Get(m); err != nil {
				return fmt.Errorf("message %d of %d: %w", i, count, err)
			}
			if op == OpEcho {
				if err := c.Put(m); err != nil {
					return err
				}
			} else if binary.LittleEndian.Uint64(m) != i {
				wrong++
			}
		}
		if op == OpSink {
			binary.LittleEndian.PutUint64(h, count*uint64(size))
			binary.LittleEndian.PutUint64(h[8:], wrong)
			if err := c.Put(h); err != nil {
				return err
			}
		}
	}
}

// PingPong sends count messages of size bytes, inflight out at a time, and
// checks each echo: the time it all took and every message's round trip.
func PingPong(c Conn, size, inflight, count int) (time.Duration, []time.Duration, error) {
	sent := make([]time.Time, count)
	rtt := make([]time.Duration, count)
	out, in, want := make([]byte, size), make([]byte, size), make([]byte, size)
	if err := c.Put(Header(OpEcho, uint32(size), uint64(count))); err != nil {
		return 0, nil, err
	}
	t0 := time.Now()
	next := 0
	for got := 0; got < count; got++ {
		for ; next < count && next < got+inflight; next++ {
			Fill(out, uint64(next))
			sent[next] = time.Now()
			if err := c.Put(out); err != nil {
				return 0, nil, err
			}
		}
		if err := c.Get(in); err != nil {
			return 0, nil, fmt.Errorf("echo %d: %w", got, err)
		}
		rtt[got] = time.Since(sent[got])
		Fill(want, uint64(got))
		if !bytes.Equal(in, want) {
			return 0, nil, fmt.Errorf("echo %d differs from what was sent", got)
		}
	}
	return time.Since(t0), rtt, nil
}

// Stream sends count messages of size bytes and waits for the server's
// count of them: the time from the first send to that answer.
func Stream(c Conn, size, count int) (time.Duration, error) {
	if err := c.Put(Header(OpSink, uint32(size), uint64(count))); err != nil {
		return 0, err
	}
	m := make([]byte, size)
	Fill(m, 0)
	t0 := time.Now()
	for i := 0; i < count; i++ {
		binary.LittleEndian.PutUint64(m, uint64(i))
		if err := c.Put(m); err != nil {
			return 0, err
		}
	}
	a := make([]byte, 16)
	if err := c.Get(a); err != nil {
		return 0, fmt.Errorf("the server's count: %w", err)
	}
	d := time.Since(t0)
	if n, wrong := binary.LittleEndian.Uint64(a), binary.LittleEndian.Uint64(a[8:]); n != uint64(size*count) || wrong != 0 {
		return 0, fmt.Errorf("the server read %d bytes (%d messages misnumbered), want %d", n, wrong, size*count)
	}
	return d, nil
}

// SDK is a vconn of package vconn, by messages.
type SDK struct {
	Ctx context.Context
	C   *vconn.Conn
}

// Put sends b as one message.
func (s SDK) Put(b []byte) error { return s.C.SendMsg(s.Ctx, b) }

// Get receives one message of exactly len(b) bytes into b.
func (s SDK) Get(b []byte) error {
	m, err := s.C.RecvMsg(s.Ctx)
	if err != nil {
		return err
	}
	if len(m.Data) != len(b) {
		return fmt.Errorf("a message of %d bytes, want %d", len(m.Data), len(b))
	}
	copy(b, m.Data)
	return nil
}
