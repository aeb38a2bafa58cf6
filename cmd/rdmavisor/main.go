// Command rdmavisor is the user CLI: demos and benchmarks.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/demo"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

const usage = `usage: rdmavisor <command> [flags]

commands:
  demo    run the demo on the software RDMA provider
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	var err error
	switch os.Args[1] {
	case "demo":
		err = runDemo(ctx, os.Args[2:])
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

func runDemo(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ExitOnError)
	msgs := fs.Int("messages", 20000, "messages in the streaming phase")
	size := fs.Int("size", 4096, "message size in bytes")
	rounds := fs.Int("pingpong", 1000, "round trips in the latency phase")
	mtu := fs.Int("mtu", 4096, "path MTU: 256, 512, 1024, 2048 or 4096")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	_ = fs.Parse(args)
	m, err := verbs.MTUFromBytes(*mtu)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	return demo.Verbs(ctx, os.Stdout, demo.VerbsOptions{Messages: *msgs, Size: *size, PingPong: *rounds, MTU: m})
}
