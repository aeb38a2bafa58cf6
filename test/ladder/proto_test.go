package ladder_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// The protocol of clib/test/ladder.h, which every path's client and server
// speak: a 16-byte header (op, size: u32; count: u64; little-endian), then
// count messages of size bytes, echoed (opEcho) or counted and checked by
// their number (opSink, answered with 16 bytes: the bytes read and the
// messages misnumbered).
const (
	opEcho = 1
	opSink = 2
	opQuit = 3
	maxMsg = 64 << 10
)

// conn is one end of a path's connection: put sends one message, get
// receives one of exactly len(b) bytes into b (io.EOF when the peer hung
// up before it). On a byte stream, a message is len(b) bytes of it.
type conn interface {
	put(b []byte) error
	get(b []byte) error
}

func header(op, size uint32, count uint64) []byte {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h, op)
	binary.LittleEndian.PutUint32(h[4:], size)
	binary.LittleEndian.PutUint64(h[8:], count)
	return h
}

// fill writes message seq of an echo: its number, then bytes that depend
// on it and on their place (ladder.h's ladder_fill).
func fill(b []byte, seq uint64) {
	binary.LittleEndian.PutUint64(b, seq)
	for i := 8; i < len(b); i++ {
		b[i] = byte(seq*7 + uint64(i))
	}
}

// serve answers one client until it quits or hangs up.
func serve(c conn) error {
	h := make([]byte, 16)
	buf := make([]byte, maxMsg)
	for {
		if err := c.get(h); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		op, size, count := binary.LittleEndian.Uint32(h), binary.LittleEndian.Uint32(h[4:]), binary.LittleEndian.Uint64(h[8:])
		if op == opQuit {
			return nil
		}
		if size < 8 || size > maxMsg || (op != opEcho && op != opSink) {
			return fmt.Errorf("bad header %x", h)
		}
		m := buf[:size]
		var wrong uint64
		for i := uint64(0); i < count; i++ {
			if err := c.get(m); err != nil {
				return fmt.Errorf("message %d of %d: %w", i, count, err)
			}
			if op == opEcho {
				if err := c.put(m); err != nil {
					return err
				}
			} else if binary.LittleEndian.Uint64(m) != i {
				wrong++
			}
		}
		if op == opSink {
			binary.LittleEndian.PutUint64(h, count*uint64(size))
			binary.LittleEndian.PutUint64(h[8:], wrong)
			if err := c.put(h); err != nil {
				return err
			}
		}
	}
}

// pingPong sends count messages of size bytes, inflight out at a time, and
// checks each echo: the time it all took and every message's round trip.
func pingPong(c conn, size, inflight, count int) (time.Duration, []time.Duration, error) {
	sent := make([]time.Time, count)
	rtt := make([]time.Duration, count)
	out, in, want := make([]byte, size), make([]byte, size), make([]byte, size)
	if err := c.put(header(opEcho, uint32(size), uint64(count))); err != nil {
		return 0, nil, err
	}
	t0 := time.Now()
	next := 0
	for got := 0; got < count; got++ {
		for ; next < count && next < got+inflight; next++ {
			fill(out, uint64(next))
			sent[next] = time.Now()
			if err := c.put(out); err != nil {
				return 0, nil, err
			}
		}
		if err := c.get(in); err != nil {
			return 0, nil, fmt.Errorf("echo %d: %w", got, err)
		}
		rtt[got] = time.Since(sent[got])
		fill(want, uint64(got))
		if !bytes.Equal(in, want) {
			return 0, nil, fmt.Errorf("echo %d differs from what was sent", got)
		}
	}
	return time.Since(t0), rtt, nil
}

// stream sends count messages of size bytes and waits for the server's
// count of them: the time from the first send to that answer.
func stream(c conn, size, count int) (time.Duration, error) {
	if err := c.put(header(opSink, uint32(size), uint64(count))); err != nil {
		return 0, err
	}
	m := make([]byte, size)
	fill(m, 0)
	t0 := time.Now()
	for i := 0; i < count; i++ {
		binary.LittleEndian.PutUint64(m, uint64(i))
		if err := c.put(m); err != nil {
			return 0, err
		}
	}
	a := make([]byte, 16)
	if err := c.get(a); err != nil {
		return 0, fmt.Errorf("the server's count: %w", err)
	}
	d := time.Since(t0)
	if n, wrong := binary.LittleEndian.Uint64(a), binary.LittleEndian.Uint64(a[8:]); n != uint64(size*count) || wrong != 0 {
		return 0, fmt.Errorf("the server read %d bytes (%d messages misnumbered), want %d", n, wrong, size*count)
	}
	return d, nil
}
