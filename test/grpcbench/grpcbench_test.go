// Package grpcbench_test runs grpc-go's own benchmark service (package
// google.golang.org/grpc/benchmark, the BenchmarkService of its interop
// protos) between two agents of the test harness over vconns (pkg/vconn:
// the server on a vconn listener, the client dialling vconns), and the same
// service over TCP on 127.0.0.1 in the same run: part of benchmark E6,
// programs nobody here wrote.
//
// Without RDMAVISOR_E6_REPORT the test only checks that unary calls of each
// payload size succeed on both paths, from 1 and from 16 callers at once,
// and that each reply carries the request's payload back. With
// RDMAVISOR_E6_REPORT=FILE it measures unary calls/s and p50/p99 latency
// at 1 and 16 concurrent callers and payloads (request and response) of
// 64 B, 4 KiB and 64 KiB: RDMAVISOR_E6_ROUNDS rounds (default 5), each
// running the vconn path and then the TCP path (or the other way round, in
// turns) for RDMAVISOR_E6_ROUND (default 2s) each, and writes a markdown
// table of the medians over the rounds and the median of the rounds'
// vconns/TCP ratios to FILE. RDMAVISOR_E6_SHM=1 puts the vconn client and
// server on shared memory rings (vconn.Options.SharedMemory) rather than
// the agent's unix socket. hack/bench-e6-programs.sh runs it.
package grpcbench_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/benchmark"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/bench"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

var (
	sizes   = []int{64, 4 << 10, 64 << 10}
	callers = []int{1, 16}
)

// path is one way to the benchmark service: over vconns or over TCP.
type path struct {
	name string
	svc  testgrpc.BenchmarkServiceClient
}

// echo makes the benchmark service's reply carry the request's payload
// back: its UnaryCall answers with a zeroed body of the size asked for,
// which the interceptor replaces with the request's (the sizes are
// equal), so that every reply can be checked byte for byte. The bytes on
// the wire are as many as the service's own reply's.
func echo(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil {
		return resp, err
	}
	in, out := req.(*testpb.SimpleRequest), resp.(*testpb.SimpleResponse)
	if got, want := len(out.GetPayload().GetBody()), len(in.GetPayload().GetBody()); got != want {
		return nil, status.Errorf(codes.Internal, "the service answered %d bytes, not the %d of the request", got, want)
	}
	out.Payload.Body = in.Payload.Body
	return out, nil
}

// serve starts grpc-go's benchmark server on ln until the test ends.
func serve(t *testing.T, ln net.Listener) {
	stop := benchmark.StartServer(benchmark.ServerInfo{Type: "protobuf", Listener: ln}, grpc.UnaryInterceptor(echo))
	t.Cleanup(stop)
}

// connect makes a client of the service at addr, dialling with dial (nil:
// TCP).
func connect(t *testing.T, name, addr string, dial func(context.Context, string) (net.Conn, error)) path {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if dial != nil {
		opts = append(opts, grpc.WithContextDialer(dial))
	}
	cc := benchmark.NewClientConn("passthrough:///"+addr, opts...)
	t.Cleanup(func() { _ = cc.Close() })
	return path{name: name, svc: testgrpc.NewBenchmarkServiceClient(cc)}
}

// vconnClient allocates k vconns on node n and connects a client to them.
func vconnClient(t *testing.T, n *agenttest.Node, id string, k int, shm bool) *vconn.Client {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sock, err := n.Allocate(ctx, id, k)
	if err != nil {
		t.Fatal(err)
	}
	c, err := vconn.NewClient(ctx, vconn.Options{Socket: sock, SharedMemory: shm})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// setup starts the benchmark service twice, on a vconn listener of
// node-b's and on a TCP listener on 127.0.0.1, and gives a client of
// each: node-a's over vconns, and one over TCP.
func setup(t *testing.T, shm bool) (vc, tcp path) {
	cl, err := agenttest.Start(agenttest.Options{VConnsPerNode: 256, Transport: "auto"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	srv := vconnClient(t, cl.Nodes[1], "grpc-server", 16, shm)
	cli := vconnClient(t, cl.Nodes[0], "grpc-client", 16, shm)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	vln, err := srv.Listen(ctx, ":50051")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, vln)
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, tln)
	vc = connect(t, "vconns", cl.Nodes[1].Name+":50051", func(ctx context.Context, addr string) (net.Conn, error) { return cli.Dial(ctx, addr) })
	tcp = connect(t, "TCP", tln.Addr().String(), nil)
	return vc, tcp
}

// request is a unary call's request of size random bytes, asking for a
// reply of the same size.
func request(size int) *testpb.SimpleRequest {
	pl := benchmark.NewPayload(testpb.PayloadType_COMPRESSABLE, size)
	_, _ = rand.Read(pl.Body)
	return &testpb.SimpleRequest{ResponseType: pl.Type, ResponseSize: int32(size), Payload: pl}
}

// call makes one unary call and checks that its reply carries req's
// payload.
func call(ctx context.Context, p path, req *testpb.SimpleRequest) error {
	rep, err := p.svc.UnaryCall(ctx, req)
	if err != nil {
		return fmt.Errorf("%s: UnaryCall of %d bytes: %w", p.name, len(req.Payload.Body), err)
	}
	if got := rep.GetPayload().GetBody(); !bytes.Equal(got, req.Payload.Body) {
		return fmt.Errorf("%s: UnaryCall of %d bytes: the reply's %d bytes differ from the request's", p.name, len(req.Payload.Body), len(got))
	}
	return nil
}

// measured is one path's run at one setting.
type measured struct {
	rate     float64 // calls/s
	p50, p99 time.Duration
}

// run has n callers call p, each with a payload of size bytes, for d, and
// gives the rate over all callers and the latency percentiles over all
// calls.
func run(ctx context.Context, p path, n, size int, d time.Duration) (measured, error) {
	lat := make([][]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for i := range n {
		wg.Go(func() {
			req := request(size)
			for time.Now().Before(end) {
				t0 := time.Now()
				if err := call(ctx, p, req); err != nil {
					errs[i] = err
					return
				}
				lat[i] = append(lat[i], time.Since(t0))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return measured{}, err
		}
	}
	all := slices.Concat(lat...)
	slices.Sort(all)
	if len(all) == 0 {
		return measured{}, fmt.Errorf("%s: no call completed in %v", p.name, d)
	}
	return measured{
		rate: float64(len(all)) / elapsed.Seconds(),
		p50:  all[len(all)/2],
		p99:  all[min(len(all)-1, len(all)*99/100)],
	}, nil
}

// TestGRPCBenchmark: without RDMAVISOR_E6_REPORT, a check that grpc-go's
// benchmark service answers unary calls of each size over vconns and over
// TCP, from 1 and 16 callers, with the request's payload; with it, the
// measurement (see the package's comment).
func TestGRPCBenchmark(t *testing.T) {
	vc, tcp := setup(t, os.Getenv("RDMAVISOR_E6_SHM") == "1")
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	report := os.Getenv("RDMAVISOR_E6_REPORT")
	if report == "" {
		for _, p := range []path{vc, tcp} {
			for _, n := range callers {
				for _, size := range sizes {
					var wg sync.WaitGroup
					errs := make(chan error, n)
					for range n {
						wg.Go(func() {
							req := request(size)
							for range 3 {
								if err := call(ctx, p, req); err != nil {
									errs <- err
									return
								}
							}
						})
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						t.Errorf("%d callers: %v", n, err)
					}
				}
			}
		}
		return
	}
	rounds := 5
	if s := os.Getenv("RDMAVISOR_E6_ROUNDS"); s != "" {
		var err error
		if rounds, err = strconv.Atoi(s); err != nil || rounds < 1 {
			t.Fatalf("RDMAVISOR_E6_ROUNDS=%q: want a count of rounds", s)
		}
	}
	d := 2 * time.Second
	if s := os.Getenv("RDMAVISOR_E6_ROUND"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d <= 0 {
			t.Fatalf("RDMAVISOR_E6_ROUND=%q: want a duration", s)
		}
	}
	var b strings.Builder
	fmt.Fprintln(&b, "| program | figure | over vconns | over TCP | vconns/TCP |")
	fmt.Fprintln(&b, "|---|---|---:|---:|---:|")
	for _, n := range callers {
		for _, size := range sizes {
			// A short run of each first: connections up, buffers grown.
			for _, p := range []path{vc, tcp} {
				if _, err := run(ctx, p, n, size, d/4); err != nil {
					t.Fatal(err)
				}
			}
			var v, p []measured
			for r := range rounds {
				order := []path{vc, tcp}
				if r%2 == 1 {
					order = []path{tcp, vc}
				}
				for _, q := range order {
					m, err := run(ctx, q, n, size, d)
					if err != nil {
						t.Fatal(err)
					}
					if q.name == vc.name {
						v = append(v, m)
					} else {
						p = append(p, m)
					}
				}
			}
			setting := fmt.Sprintf("%d caller%s, %s", n, plural(n), sizeName(size))
			us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
			row(&b, "unary calls/s, "+setting, v, p, func(m measured) float64 { return m.rate }, "calls/s")
			row(&b, "p50 latency, "+setting, v, p, func(m measured) float64 { return us(m.p50) }, "µs")
			row(&b, "p99 latency, "+setting, v, p, func(m measured) float64 { return us(m.p99) }, "µs")
		}
	}
	t.Logf("grpc-go's benchmark service, unary calls, over vconns and over TCP on loopback (medians of %d rounds of %v each):\n%s", rounds, d, b.String())
	if err := os.WriteFile(report, []byte(b.String()), 0o644); err != nil {
		t.Error(err)
	}
}

// row writes a figure's line: the medians of each path's rounds, and the
// median of the rounds' ratios.
func row(b *strings.Builder, figure string, v, p []measured, f func(measured) float64, unit string) {
	var vs, ps, ratios []float64
	for i := range v {
		vs, ps = append(vs, f(v[i])), append(ps, f(p[i]))
		ratios = append(ratios, f(v[i])/f(p[i]))
	}
	fmt.Fprintf(b, "| grpc-go benchmark service | %s | %s %s | %s %s | %.2f |\n", figure, num(bench.Median(vs)), unit, num(bench.Median(ps)), unit, bench.Median(ratios))
}

// num writes x with three significant digits, or whole above 1000.
func num(x float64) string {
	if x >= 1000 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func sizeName(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
