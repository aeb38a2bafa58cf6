// Command rdmavisor is the user CLI: demos and benchmarks.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr/funcr"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/bench"
	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/demo"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

const usage = `usage: rdmavisor <command> [flags]

commands:
  demo    two node agents on the software RDMA provider (as root, each in
          a network namespace of its own), 1,000 vconns between a server
          and a client written with pkg/vconn
          (--verbs: the verbs-level demo, one RC QP pair)
  bench   measure the engine against the naive baseline (-h for flags)
  agent   status | pods | allocations: what the node agent holds, as JSON;
          renew-certificate: make it replace its node certificate now;
          both through its admin socket (--socket, default /var/run/rdmavisor/admin.sock)
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(ctx, os.Args[2:])
	case "bench":
		err = runBench(ctx, os.Args[2:])
	case "agent":
		err = runAgent(ctx, os.Args[2:])
	case "-h", "--help", "help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "rdmavisor: unknown command %q\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "rdmavisor:", err)
		os.Exit(1)
	}
}

// runAgent prints the node agent's state, for operators (kubectl exec into
// the agent container) and the end-to-end tests.
func runAgent(ctx context.Context, args []string) error {
	if len(args) < 1 {
		return errors.New("agent: want status, pods, allocations or renew-certificate")
	}
	fs := flag.NewFlagSet("agent", flag.ExitOnError)
	sock := fs.String("socket", config.DefaultAdminSocket, "the agent's admin socket")
	_ = fs.Parse(args[1:])
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := admin.Dial(ctx, *sock)
	if err != nil {
		return err
	}
	defer c.Close()
	var v any
	switch args[0] {
	case "status":
		v, err = c.Status(ctx)
	case "pods":
		v, err = c.ListPods(ctx)
	case "allocations":
		v, err = c.ListAllocations(ctx)
	case "renew-certificate":
		v, err = c.RenewCertificate(ctx)
	default:
		return fmt.Errorf("agent: unknown command %q: want status, pods, allocations or renew-certificate", args[0])
	}
	if err != nil {
		return err
	}
	out, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	verbsOnly := fs.Bool("verbs", false, "run the verbs demo instead: two soft devices and one RC QP pair, no agents")
	loopback := fs.Bool("loopback", false, "run both agents in this process on 127.0.0.2 and 127.0.0.3 even as root (default as root: two network namespaces)")
	vconns := fs.Int("vconns", 1000, "vconns the client opens (agents demo)")
	rounds := fs.Int("rounds", 20, "round trips per vconn (agents demo)")
	msgs := fs.Int("messages", 20000, "messages in the streaming phase (verbs demo)")
	size := fs.Int("size", 0, "message size in bytes (default: 64 for agents, 4096 for verbs)")
	pingpong := fs.Int("pingpong", 1000, "round trips in the latency phase (verbs demo)")
	mtu := fs.Int("mtu", 4096, "path MTU: 256, 512, 1024, 2048 or 4096 (verbs demo)")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	pollers := fs.Int("pollers", 0, "engine pollers of each agent (agents demo; default: half the CPUs, at least 1, as the two nodes share this machine)")
	// One node of the network-namespace demo, as the demo runs it.
	node := fs.Bool("node", false, "internal: run one node of the network-namespace demo")
	server := fs.Bool("server", false, "internal: the node is the echo server")
	name := fs.String("name", "", "internal: node name")
	ip := fs.String("ip", "", "internal: node address")
	peerName := fs.String("peer-name", "", "internal: peer node name")
	peerIP := fs.String("peer-ip", "", "internal: peer node address")
	transport := fs.String("transport", "", "internal: the agents' transport, rc, uc, ud or auto (default: the agent's)")
	provider := fs.String("provider", "soft", "internal: the node's device provider, soft or ibverbs (a binary built with -tags ibverbs)")
	_ = fs.Parse(args)
	if *pollers < 0 || *pollers > config.MaxPollers {
		return fmt.Errorf("--pollers %d: want 1..%d, or 0 for the default", *pollers, config.MaxPollers)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	o := demo.AgentsOptions{VConns: *vconns, Messages: *rounds, Size: *size, Pollers: *pollers}
	switch {
	case *node:
		return demo.RunNode(ctx, os.Stdout, demo.NodeOptions{Server: *server, Name: *name, IP: *ip, PeerName: *peerName, PeerIP: *peerIP, Provider: config.Provider(*provider), Transport: config.Transport(*transport), AgentsOptions: o})
	case !*verbsOnly && !*loopback && demo.CanUseNetns():
		self, err := os.Executable()
		if err != nil {
			return err
		}
		return demo.AgentsNetns(ctx, os.Stdout, o, self)
	case !*verbsOnly:
		return demo.Agents(ctx, os.Stdout, o)
	}
	m, err := verbs.MTUFromBytes(*mtu)
	if err != nil {
		return err
	}
	if *size == 0 {
		*size = 4096
	}
	return demo.Verbs(ctx, os.Stdout, demo.VerbsOptions{Messages: *msgs, Size: *size, PingPong: *pingpong, MTU: m})
}

func runBench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ExitOnError)
	suite := fs.String("suite", "all", "suites to run: e1, e2, e3, e5, a comma-separated list, or all")
	quick := fs.Bool("quick", false, "one 0.4 s window after 0.2 s of warm-up per line (full: the median of three 1.5 s windows, each after 0.5 s) and E5 at every other size; all counts kept")
	format := fs.String("format", "json", "output: json (one object per line) or text")
	budget := fs.String("budget-bytes", "2GiB", "resident memory a measurement may reach (estimated from smaller counts), e.g. 2GiB")
	wireKind := fs.String("wire", "", "wire between the two soft devices for every suite: fabric (in memory) or udp (127.0.0.2 and 127.0.0.3); default: udp for e3 (batched doorbells only show where a post costs something), fabric for the others")
	out := fs.String("out", "", "also write DIR/engine.jsonl and DIR/engine-summary.md")
	summarize := fs.String("summarize", "", "print the Markdown summary of a JSON lines FILE and exit")
	vconns := fs.String("vconns", "", "comma-separated connection counts for E1 and E2 instead of the plan's")
	pollers := fs.Int("pollers", 1, "E1: polling goroutines of every endpoint, engine and naive (1..64)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the run to FILE")
	verbose := fs.Int("v", 0, "log verbosity on stderr")
	_ = fs.Parse(args)
	if *summarize != "" {
		return bench.SummarizeFile(*summarize, os.Stdout)
	}
	b, err := bench.ParseBytes(*budget)
	if err != nil {
		return err
	}
	o := bench.Options{
		Plan: bench.FullPlan(), Budget: b, Wire: *wireKind, Format: *format, Out: os.Stdout,
		Log: funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{Verbosity: *verbose}),
	}
	if *quick {
		o.Plan = bench.QuickPlan()
	}
	o.Plan.Pollers = *pollers
	if *suite != "all" {
		o.Suites = strings.Split(*suite, ",")
	}
	if *vconns != "" {
		ns, err := bench.ParseCounts(*vconns)
		if err != nil {
			return fmt.Errorf("--vconns: %w", err)
		}
		o.Plan.E1VConns, o.Plan.E2EngineVConns, o.Plan.E2NaiveVConns = ns, ns, ns
	}
	if *cpuProfile != "" {
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	return bench.RunToDir(ctx, o, *out)
}

// startCPUProfile profiles the process's CPU into the file path until stop.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
