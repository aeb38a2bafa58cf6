// Command grpcecho runs gRPC over vconns as an application would, using
// only grpc-go and pkg/vconn: a server whose grpc.Server serves a
// vconn.Listener, and a client whose grpc.NewClient resolves a headless
// Service's name with gRPC's own dns resolver (the cluster's DNS) and
// dials each pod IP it gets with a vconn, spreading calls over the pods
// with round_robin.
//
//	grpcecho server --port 7100
//	grpcecho client --target dns:///grpcecho.default.svc.cluster.local:7100 --calls 200 --size 4096
//
// The service is one unary method, /grpcecho.Echo/Echo, whose request and
// response are raw bytes (a codec registered as "raw"), so the example
// needs no generated code. The client exits 0 and prints "grpcecho: OK
// ..." when every reply matched its request byte for byte; --verdict FILE
// writes its outcome as JSON, as examples/echo does.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"

	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("grpcecho: ")
	if len(os.Args) < 2 {
		log.Fatal("usage: grpcecho server|client [flags]")
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
		port := fs.Int("port", 7100, "port to listen on")
		_ = fs.Parse(os.Args[2:])
		err = serve(ctx, c, *port)
	case "client":
		target := fs.String("target", "dns:///grpcecho.default.svc.cluster.local:7100", "gRPC target: dns:///SERVICE.NAMESPACE.svc.cluster.local:PORT (a headless Service), or a pod's IP:PORT")
		calls := fs.Int("calls", 200, "unary calls to make")
		size := fs.Int("size", 4096, "bytes per request")
		timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
		hold := fs.Bool("hold", false, "after success, keep running until stopped (so the pod stays up)")
		verdict := fs.String("verdict", "", "write the outcome here as JSON (e.g. /dev/termination-log)")
		_ = fs.Parse(os.Args[2:])
		runCtx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		var count counts
		var summary string
		summary, err = client(runCtx, c, *target, *calls, *size, &count)
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

// rawCodec carries a message as its bytes, unchanged: requests and
// replies are *[]byte. Registered under its name, it is the codec of
// calls made with grpc.CallContentSubtype("raw"), on both sides.
type rawCodec struct{}

func (rawCodec) Name() string { return "raw" }

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("raw codec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("raw codec: cannot unmarshal into %T", v)
	}
	// data may be reused once Unmarshal returns.
	*b = append((*b)[:0], data...)
	return nil
}

func init() { encoding.RegisterCodec(rawCodec{}) }

const echoMethod = "/grpcecho.Echo/Echo"

// echoService is the Echo service, written out as protoc-gen-go-grpc would
// generate it: one unary method that returns its request.
var echoService = grpc.ServiceDesc{
	ServiceName: "grpcecho.Echo",
	HandlerType: (*any)(nil),
	Methods: []grpc.MethodDesc{{
		MethodName: "Echo",
		Handler: func(srv any, ctx context.Context, dec func(any) error, interceptor grpc.UnaryServerInterceptor) (any, error) {
			in := new([]byte)
			if err := dec(in); err != nil {
				return nil, err
			}
			echo := func(_ context.Context, req any) (any, error) { return req, nil }
			if interceptor == nil {
				return echo(ctx, in)
			}
			return interceptor(ctx, in, &grpc.UnaryServerInfo{Server: srv, FullMethod: echoMethod}, echo)
		},
	}},
	Metadata: "grpcecho",
}

func serve(ctx context.Context, c *vconn.Client, port int, opts ...grpc.ServerOption) error {
	ln, err := c.Listen(ctx, fmt.Sprintf(":%d", port))
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	srv := grpc.NewServer(opts...)
	srv.RegisterService(&echoService, struct{}{})
	go func() { <-ctx.Done(); srv.GracefulStop() }()
	log.Printf("listening on %s", ln.Addr())
	if err := srv.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("serving: %w", err)
	}
	return nil
}

// counts are the client's calls: sent, and delivered (answered with
// every byte as sent).
type counts struct{ sent, delivered atomic.Int64 }

func client(ctx context.Context, c *vconn.Client, target string, calls, size int, count *counts) (string, error) {
	conn, err := grpc.NewClient(target,
		// gRPC resolves the target and hands the dialer each pod's
		// IP:port; a vconn to it is the connection.
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return c.Dial(ctx, addr)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
		// WaitForReady: until the Service has a ready pod that listens,
		// calls wait (re-resolving, redialling) rather than fail; the
		// server's pod may start after the client's.
		grpc.WithDefaultCallOptions(grpc.CallContentSubtype(rawCodec{}.Name()), grpc.WaitForReady(true)),
	)
	if err != nil {
		return "", fmt.Errorf("client for %s: %w", target, err)
	}
	defer conn.Close()
	start := time.Now()
	req := make([]byte, size)
	var checked int64
	for i := range calls {
		fill(req, i)
		count.sent.Add(1)
		var rep []byte
		if err := conn.Invoke(ctx, echoMethod, &req, &rep); err != nil {
			return "", fmt.Errorf("call %d: %w", i, err)
		}
		if len(rep) != len(req) {
			return "", fmt.Errorf("call %d: %d bytes back, sent %d", i, len(rep), len(req))
		}
		for j := range rep {
			if rep[j] != req[j] {
				return "", fmt.Errorf("call %d: byte %d is %#x, sent %#x", i, j, rep[j], req[j])
			}
		}
		count.delivered.Add(1)
		checked += int64(len(rep))
	}
	d := time.Since(start)
	return fmt.Sprintf("grpcecho: OK %d calls, %d bytes checked in %s (%.0f calls/s)",
		calls, checked, d.Round(time.Millisecond), float64(calls)/d.Seconds()), nil
}

func fill(b []byte, seq int) {
	for i := range b {
		b[i] = byte(seq*7 + i*13)
	}
}

// Verdict is what --verdict writes, as examples/echo's: whether every call
// came back intact, and if not why, and when the client knew; how many
// calls it made and how many came back intact.
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
