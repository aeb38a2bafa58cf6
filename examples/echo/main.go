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
// The client exits 0 and prints "echo: OK ..." when every message came back
// intact. With --verdict FILE it also writes its outcome there as JSON, with
// the time it ended: a pod's /dev/termination-log, which the kubelet puts in
// the pod's status, where the end-to-end tests read it.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
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
		verdict := fs.String("verdict", "", "write the outcome here as JSON (e.g. /dev/termination-log)")
		_ = fs.Parse(os.Args[2:])
		runCtx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		var summary string
		var count counts
		summary, err = client(runCtx, c, *addr, *conns, *n, *size, &count)
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

// client runs the exchanges and returns the summary line.
// counts are the client's messages: sent (SendMsg returned nil) and
// delivered (echoed back, every byte as sent, in order).
type counts struct{ sent, delivered atomic.Int64 }

func client(ctx context.Context, c *vconn.Client, addr string, conns, n, size int, count *counts) (string, error) {
	if addr == "" {
		return "", errors.New("--addr is required")
	}
	start := time.Now()
	errs := make(chan error, conns)
	for i := range conns {
		go func() { errs <- exchange(ctx, c, addr, i, n, size, count) }()
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

// exchange sends n messages on one vconn, each filled from its vconn,
// sequence number and offset, and checks each echo byte by byte.
func exchange(ctx context.Context, c *vconn.Client, addr string, id, n, size int, count *counts) error {
	conn, err := dial(ctx, c, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	msg := make([]byte, size)
	for seq := range n {
		fill(msg, id, seq)
		if err := conn.SendMsg(ctx, msg); err != nil {
			return fmt.Errorf("vconn %d: send %d: %w", id, seq, err)
		}
		count.sent.Add(1)
		m, err := conn.RecvMsg(ctx)
		if err != nil {
			return fmt.Errorf("vconn %d: receive %d: %w", id, seq, err)
		}
		if len(m.Data) != size {
			return fmt.Errorf("vconn %d: message %d: %d bytes back, sent %d", id, seq, len(m.Data), size)
		}
		for i, b := range m.Data {
			if b != msg[i] {
				return fmt.Errorf("vconn %d: message %d: byte %d is %#x, sent %#x", id, seq, i, b, msg[i])
			}
		}
		count.delivered.Add(1)
	}
	return nil
}

// dial retries while nothing listens at addr yet, and while addr's name or
// pod IP is not known yet (a headless Service without ready pods, a pod
// its node has not announced): the server's pod may start after the
// client's.
func dial(ctx context.Context, c *vconn.Client, addr string) (*vconn.Conn, error) {
	for {
		conn, err := c.Dial(ctx, addr)
		if err == nil || !errors.Is(err, vconn.ErrRefused) && !errors.Is(err, vconn.ErrUnknownHost) && !errors.Is(err, vconn.ErrUnreachable) {
			return conn, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func fill(b []byte, id, seq int) {
	for i := range b {
		b[i] = byte(id*131 + seq*7 + i)
	}
}

// Verdict is what --verdict writes: whether every message came back, and
// if not why, and when the client knew; how many messages it sent and how
// many came back intact.
type Verdict struct {
	OK        bool      `json:"ok"`
	Error     string    `json:"error,omitempty"`
	At        time.Time `json:"at"`
	Sent      int64     `json:"sent"`
	Delivered int64     `json:"delivered"`
}

func writeVerdict(path string, err error, count *counts) {
	v := Verdict{OK: err == nil, At: time.Now().UTC(), Sent: count.sent.Load(), Delivered: count.delivered.Load()}
	if err != nil {
		v.Error = err.Error()
	}
	b, _ := json.Marshal(v)
	if werr := os.WriteFile(path, b, 0o644); werr != nil {
		log.Printf("writing the verdict to %s: %v", path, werr)
	}
}
