// Command echo is the smallest RDMAvisor application: a server that echoes
// every message on its vconns, and a client that sends messages over
// several vconns at once and checks every byte that comes back. It uses
// only pkg/vconn; the pod's allocation arrives in RDMAVISOR_SOCKET and
// RDMAVISOR_VCONNS when the pod requests rdmavisor.io/vconn.
//
//	echo server --port 7000
//	echo client --addr POD_IP:7000 --conns 2 --messages 1000 --size 4096
//	echo client --addr SERVICE.NAMESPACE.svc:7000   (a headless Service's name)
//
// The client numbers its messages, keeps up to --window of them in flight
// on each vconn (1: it waits for each echo before the next), and exits 0
// and prints "echo: OK ..." when every message came back intact and in
// order. With --verdict FILE it also writes its outcome there as JSON,
// with the time it ended: a pod's /dev/termination-log, which the kubelet
// puts in the pod's status, where the end-to-end tests read it. The
// verdict says, by number, what became of the messages that did not come
// back: failed with an error the client was told, or vanished with none.
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("echo: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: echo server|client [flags] | echo show FILE")
	}
	// show prints a file this program wrote (--verdict, --ready): what a
	// probe or kubectl exec reads in an image that has nothing else.
	if os.Args[1] == "show" {
		if len(os.Args) != 3 {
			log.Fatal("usage: echo show FILE")
		}
		b, err := os.ReadFile(os.Args[2])
		if err != nil || len(b) == 0 {
			log.Fatalf("show %s: nothing written yet (%v)", os.Args[2], err)
		}
		fmt.Println(string(b))
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	c, err := vconn.Default(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	switch os.Args[1] {
	case "server":
		port := fs.Int("port", 7000, "port to listen on")
		ready := fs.String("ready", "", "once listening, write the address here as JSON (a readiness probe runs: echo show FILE)")
		_ = fs.Parse(os.Args[2:])
		err = serve(ctx, c, *port, *ready)
	case "client":
		addr := fs.String("addr", "", "server address: the server pod's IP:port (it prints it), or a headless Service's name:port (SERVICE.NAMESPACE.svc:7000)")
		conns := fs.Int("conns", 2, "vconns to open at once")
		n := fs.Int("messages", 1000, "messages per vconn")
		size := fs.Int("size", 4096, "bytes per message")
		timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
		hold := fs.Bool("hold", false, "after success, keep running until stopped (so the pod stays up)")
		window := fs.Int("window", 1, "messages in flight per vconn, numbered; an echo must come back in order")
		verdict := fs.String("verdict", "", "write the outcome here as JSON (e.g. /dev/termination-log)")
		_ = fs.Parse(os.Args[2:])
		runCtx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		var summary string
		var count counts
		summary, err = client(runCtx, c, *addr, *conns, *n, *size, *window, &count)
		if *verdict != "" {
			writeVerdict(*verdict, err, &count)
		}
		if err == nil {
			fmt.Println(summary)
			if *hold {
				<-ctx.Done()
			}
		}
	default:
		err = fmt.Errorf("unknown command %q: want server or client", os.Args[1])
	}
	if err != nil {
		c.Close()
		log.Fatal(err)
	}
}

func serve(ctx context.Context, c *vconn.Client, port int, ready string) error {
	ln, err := c.Listen(ctx, fmt.Sprintf(":%d", port))
	if err != nil {
		return err
	}
	go func() { <-ctx.Done(); _ = ln.Close() }()
	log.Printf("listening on %s", ln.Addr())
	if ready != "" {
		b, _ := json.Marshal(struct {
			Listening string `json:"listening"`
		}{ln.Addr().String()})
		if err := os.WriteFile(ready, b, 0o644); err != nil {
			return fmt.Errorf("writing %s: %w", ready, err)
		}
	}
	for {
		conn, err := ln.AcceptVConn()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer conn.Close()
			n, err := echo(ctx, conn)
			log.Printf("vconn from %s: echoed %d messages (%v)", conn.RemoteAddr(), n, err)
		}()
	}
}

// echo sends back every message until the peer closes.
func echo(ctx context.Context, conn *vconn.Conn) (int, error) {
	for n := 0; ; n++ {
		m, err := conn.RecvMsg(ctx)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if err := conn.SendMsg(ctx, m.Data); err != nil {
			return n, err
		}
	}
}

// counts are the client's messages: sent (SendMsg returned nil) and
// delivered (echoed back, every byte as sent, in order), and what each
// vconn that did not deliver all of its messages came to.
type counts struct {
	sent, delivered atomic.Int64

	mu     sync.Mutex
	vconns []VConn // guarded by mu
}

// client runs the exchanges and returns the summary line.
func client(ctx context.Context, c *vconn.Client, addr string, conns, n, size, window int, count *counts) (string, error) {
	if addr == "" {
		return "", errors.New("--addr is required")
	}
	if size < header {
		return "", fmt.Errorf("--size %d: a message carries its %d-byte number", size, header)
	}
	if window < 1 {
		return "", fmt.Errorf("--window %d: at least one message in flight", window)
	}
	start := time.Now()
	errs := make(chan error, conns)
	for i := range conns {
		go func() {
			r, err := exchange(ctx, c, addr, i, n, size, window, count)
			if r.Sent != r.Delivered || err != nil {
				count.mu.Lock()
				count.vconns = append(count.vconns, r)
				count.mu.Unlock()
			}
			errs <- err
		}()
	}
	var failed error
	for range conns {
		if err := <-errs; err != nil && failed == nil {
			failed = err
		}
	}
	if failed != nil {
		return "", failed
	}
	d := time.Since(start)
	total := conns * n
	return fmt.Sprintf("echo: OK %d vconns, %d messages of %d bytes checked in %s (%.0f round trips/s)",
		conns, total, size, d.Round(time.Millisecond), float64(total)/d.Seconds()), nil
}

// header is the bytes of a message that carry its number.
const header = 8

// exchange dials addr and sends n messages on the vconn, numbered from 0
// and filled from the vconn's id, the number and the offset, with at most
// window of them unanswered, and checks each echo byte by byte. It returns
// what became of every message sent, by number, and the first thing that
// went wrong.
func exchange(ctx context.Context, c *vconn.Client, addr string, id, n, size, window int, count *counts) (VConn, error) {
	r := VConn{ID: id}
	conn, err := dial(ctx, c, addr)
	if err != nil {
		r.Error = err.Error()
		return r, fmt.Errorf("vconn %d: %w", id, err)
	}
	defer conn.Close()

	// The sender stops at its first error and takes the receiver down
	// with it; the receiver, done, stops the sender.
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	s := &sender{conn: conn, id: id, n: n, size: size, count: count, slots: make(chan struct{}, window), stop: stop}
	sendErr := make(chan error, 1)
	go func() { sendErr <- s.run(rctx) }()

	rv := &receiver{r: &r, s: s, late: map[int64]bool{}, want: make([]byte, size)}
	ended := rv.receive(rctx)
	stop()
	failed := <-sendErr
	if failed != nil && ctx.Err() != nil && errors.Is(failed, ctx.Err()) {
		failed = nil // the client's time ran out, not the vconn
	}
	r.Sent = s.sent.Load()
	if ended != nil {
		failed = unanswered(ctx, conn, &r, rv.next, ended, failed)
	}
	err = cmp.Or(rv.wrong, failed)
	if err != nil {
		r.Error = err.Error()
	}
	return r, err
}

// sender sends a vconn's n numbered messages of size bytes, each taking
// one of the window's slots, which the receiver frees as they are answered.
type sender struct {
	conn        *vconn.Conn
	id, n, size int
	count       *counts
	slots       chan struct{}
	tried, sent atomic.Int64 // messages SendMsg was called with, and took
	stop        context.CancelFunc
}

// run sends the messages until the last, ctx's end or the first error,
// which stops the receiver too.
func (s *sender) run(ctx context.Context) error {
	msg := make([]byte, s.size)
	for seq := range s.n {
		select {
		case s.slots <- struct{}{}:
		case <-ctx.Done():
			return nil
		}
		fill(msg, s.id, seq)
		s.tried.Add(1)
		if err := s.conn.SendMsg(ctx, msg); err != nil {
			s.stop()
			return fmt.Errorf("vconn %d: send %d: %w", s.id, seq, err)
		}
		s.sent.Add(1)
		s.count.sent.Add(1)
	}
	return nil
}

// receiver checks the echoes of a sender's messages into r.
type receiver struct {
	r     *VConn
	s     *sender
	next  int64          // the first number not answered yet
	late  map[int64]bool // numbers skipped, until they come back
	wrong error          // the first message that came back wrong
	want  []byte         // the message an echo's number says it is
}

// receive checks echoes until every message is answered; it returns why it
// stopped before the last.
func (rv *receiver) receive(ctx context.Context) error {
	for rv.next < int64(rv.s.n) {
		m, err := rv.s.conn.RecvMsg(ctx)
		if err != nil {
			return err
		}
		rv.check(m.Data)
	}
	return nil
}

// check counts one echo: delivered in order, damaged, ahead of messages
// that vanished, one of those come back late, or a duplicate.
func (rv *receiver) check(data []byte) {
	r, size := rv.r, rv.s.size
	seq, known := int64(-1), rv.s.tried.Load()
	if len(data) == size {
		seq = int64(binary.LittleEndian.Uint64(data))
		if seq >= 0 && seq < known {
			fill(rv.want, rv.s.id, int(seq))
		}
	}
	switch next := rv.next; {
	case seq < 0 || seq >= known || !bytes.Equal(data, rv.want):
		// Damaged: counted as the message expected next.
		r.Corrupt.add(next)
		rv.bad(fmt.Errorf("message %d: %s", next, diff(data, rv.want, size, seq, known)))
		if next < known {
			rv.answered(next + 1)
		}
	case seq == next:
		rv.delivered()
		rv.answered(next + 1)
	case seq > next:
		// In order or not at all: the messages skipped vanished,
		// unless they come back later.
		for s := next; s < seq; s++ {
			r.Vanished.add(s)
			if len(rv.late) < 1<<16 {
				rv.late[s] = true
			}
		}
		rv.bad(fmt.Errorf("message %d came back before message %d", seq, next))
		rv.delivered()
		rv.answered(seq + 1)
	case rv.late[seq]:
		delete(rv.late, seq)
		r.Vanished.remove(seq)
		r.Reordered.add(seq)
		rv.bad(fmt.Errorf("message %d came back after message %d", seq, next-1))
	default:
		r.Duplicated.add(seq)
		rv.bad(fmt.Errorf("message %d came back twice", seq))
	}
}

// bad keeps the first message that came back wrong.
func (rv *receiver) bad(err error) {
	if rv.wrong == nil {
		rv.wrong = fmt.Errorf("vconn %d: %w", rv.s.id, err)
	}
}

func (rv *receiver) delivered() {
	rv.r.Delivered++
	rv.s.count.delivered.Add(1)
}

// answered frees the slots of the numbers below to.
func (rv *receiver) answered(to int64) {
	for ; rv.next < to; rv.next++ {
		<-rv.s.slots
	}
}

// unanswered accounts for the messages from next on that r's receiver
// stopped waiting for, ended saying why, and returns the vconn's error:
// failed, the sender's, if any. They failed if the application was told
// why (a send's error, the vconn's, the peer's close), and vanished if
// the client stopped waiting with no word.
func unanswered(ctx context.Context, conn *vconn.Conn, r *VConn, next int64, ended, failed error) error {
	if failed == nil && ctx.Err() != nil && errors.Is(ended, ctx.Err()) && conn.Err() == nil {
		for s := next; s < r.Sent; s++ {
			r.Vanished.add(s)
		}
		return fmt.Errorf("vconn %d: %d messages from %d unanswered when the client stopped waiting (%w), with no error from the vconn",
			r.ID, r.Sent-next, next, ctx.Err())
	}
	for s := next; s < r.Sent; s++ {
		r.Failed.add(s)
	}
	if failed == nil {
		why := ended
		if ctx.Err() != nil && errors.Is(ended, ctx.Err()) {
			why = conn.Err() // failed before the client stopped waiting
		}
		failed = fmt.Errorf("vconn %d: receive %d: %w", r.ID, next, why)
	}
	return failed
}

// dial retries while nothing listens at addr yet, and while addr's name or
// pod IP is not known yet (a headless Service without ready pods, a pod
// its node has not announced): the server's pod may start after the
// client's. A dial cut short by ctx says why the one before failed too:
// a dial a NetworkPolicy refuses is refused until the client gives up.
func dial(ctx context.Context, c *vconn.Client, addr string) (*vconn.Conn, error) {
	var last error
	for {
		conn, err := c.Dial(ctx, addr)
		if err != nil && last != nil && ctx.Err() != nil {
			return nil, fmt.Errorf("%w; the dial before: %w", err, last)
		}
		if err == nil || !errors.Is(err, vconn.ErrRefused) && !errors.Is(err, vconn.ErrUnknownHost) && !errors.Is(err, vconn.ErrUnreachable) {
			return conn, err
		}
		last = err
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// fill makes b message seq of vconn id: its number, then bytes from the
// vconn, the number and the offset.
func fill(b []byte, id, seq int) {
	binary.LittleEndian.PutUint64(b, uint64(seq))
	for i := header; i < len(b); i++ {
		b[i] = byte(id*131 + seq*7 + i)
	}
}

// diff says how got, an echo, differs from want, message seq of known.
func diff(got, want []byte, size int, seq, known int64) string {
	switch {
	case len(got) != size:
		return fmt.Sprintf("%d bytes back, sent %d", len(got), size)
	case seq < 0 || seq >= known:
		return fmt.Sprintf("numbered %d, of %d sent", seq, known)
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("message %d's byte %d is %#x, sent %#x", seq, i, got[i], want[i])
		}
	}
	return "as sent"
}

// Verdict is what --verdict writes: whether every message came back, and
// if not why, and when the client knew; how many messages it sent and how
// many came back intact, and, by message number, what became of the
// others: failed (the application was told), vanished (no error said
// so), duplicated, reordered, corrupt. VConns are the vconns that did not
// deliver all their messages, the first few.
type Verdict struct {
	OK         bool      `json:"ok"`
	Error      string    `json:"error,omitempty"`
	At         time.Time `json:"at"`
	Sent       int64     `json:"sent"`
	Delivered  int64     `json:"delivered"`
	Failed     int64     `json:"failed,omitzero"`
	Vanished   int64     `json:"vanished,omitzero"`
	Duplicated int64     `json:"duplicated,omitzero"`
	Reordered  int64     `json:"reordered,omitzero"`
	Corrupt    int64     `json:"corrupt,omitzero"`
	VConns     []VConn   `json:"vconns,omitempty"`
}

// VConn is what became of one vconn's messages. A reliable vconn delivers
// every message it took, whole and in order, or fails with an error: what
// it took and did not deliver is Failed, numbers from Delivered on, and
// Vanished, Duplicated, Reordered and Corrupt are empty.
type VConn struct {
	ID        int   `json:"id"`
	Sent      int64 `json:"sent"`      // SendMsg took messages 0 to Sent-1
	Delivered int64 `json:"delivered"` // came back whole, in order
	// Failed: sent, not back when the vconn failed with an error, closed,
	// or a send failed; the application was told (Error).
	Failed Numbers `json:"failed,omitzero"`
	// Vanished: sent, never back, with no error: skipped (a later one
	// came back first) or unanswered when the client stopped waiting.
	Vanished Numbers `json:"vanished,omitzero"`
	// Duplicated: back a second time. Reordered: back after a later one.
	Duplicated Numbers `json:"duplicated,omitzero"`
	Reordered  Numbers `json:"reordered,omitzero"`
	// Corrupt: a message back with other bytes than its number's (counted
	// as the message expected then).
	Corrupt Numbers `json:"corrupt,omitzero"`
	Error   string  `json:"error,omitempty"`
}

// Numbers counts messages and lists the first few of their numbers.
type Numbers struct {
	N     int64   `json:"n"`
	First []int64 `json:"first,omitempty"`
}

// listed is how many numbers Numbers lists.
const listed = 4

func (ns *Numbers) add(seq int64) {
	ns.N++
	if len(ns.First) < listed {
		ns.First = append(ns.First, seq)
	}
}

func (ns *Numbers) remove(seq int64) {
	ns.N--
	ns.First = slices.DeleteFunc(ns.First, func(s int64) bool { return s == seq })
}

// verdictOf is the outcome of a client run.
func verdictOf(err error, count *counts) Verdict {
	v := Verdict{OK: err == nil, At: time.Now().UTC(), Sent: count.sent.Load(), Delivered: count.delivered.Load()}
	if err != nil {
		v.Error = err.Error()
	}
	count.mu.Lock()
	defer count.mu.Unlock()
	slices.SortFunc(count.vconns, func(a, b VConn) int { return a.ID - b.ID })
	for _, r := range count.vconns {
		v.Failed += r.Failed.N
		v.Vanished += r.Vanished.N
		v.Duplicated += r.Duplicated.N
		v.Reordered += r.Reordered.N
		v.Corrupt += r.Corrupt.N
		if len(v.VConns) < listed {
			v.VConns = append(v.VConns, r)
		}
	}
	return v
}

// maxVerdict is the most a verdict may take: a pod's termination message
// is cut at 4,096 bytes.
const maxVerdict = 4096

func writeVerdict(path string, err error, count *counts) {
	v := verdictOf(err, count)
	b, _ := json.Marshal(v)
	for len(b) > maxVerdict && len(v.VConns) > 0 {
		v.VConns = v.VConns[:len(v.VConns)-1]
		b, _ = json.Marshal(v)
	}
	if len(b) > maxVerdict {
		v.Error = v.Error[:min(len(v.Error), 1024)]
		b, _ = json.Marshal(v)
	}
	if werr := os.WriteFile(path, b, 0o644); werr != nil {
		log.Printf("writing the verdict to %s: %v", path, werr)
	}
}
