package demo

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/minicluster"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// AgentsOptions configure the two-agent demo.
type AgentsOptions struct {
	VConns   int // vconns the client opens (default 1000)
	Messages int // round trips per vconn (default 20)
	Size     int // message size in bytes (default 64)
	Workers  int // client goroutines sharing the vconns (default 32)
	// Pollers is each agent's engine pollers (default: half the CPUs
	// this process is given, at least one). The demo's two nodes share
	// this machine, where an agent's default, a poller per CPU, would
	// put two busy pollers on each core.
	Pollers int
}

// tune sets the agents' engine to o.Pollers.
func (o AgentsOptions) tune(c *engine.Config) { c.Pollers = o.Pollers }

func (o AgentsOptions) withDefaults() AgentsOptions {
	if o.VConns == 0 {
		o.VConns = 1000
	}
	if o.Messages == 0 {
		o.Messages = 20
	}
	if o.Size == 0 {
		o.Size = 64
	}
	if o.Workers == 0 {
		o.Workers = 32
	}
	if o.Pollers == 0 {
		o.Pollers = max(1, runtime.GOMAXPROCS(0)/2)
	}
	return o
}

// Agents runs two node agents (node-a on 127.0.0.2, node-b on 127.0.0.3,
// soft RDMA devices over UDP), an echo server on node-b and a client on
// node-a, both written with pkg/vconn; the client opens o.VConns vconns
// and ping-pongs on all of them. It prints the vconns, the QPs the
// engines actually use, messages/s and the round-trip latency.
func Agents(ctx context.Context, w io.Writer, o AgentsOptions) error {
	o = o.withDefaults()
	cl, err := minicluster.Start(minicluster.Options{TuneEngine: o.tune})
	if err != nil {
		return err
	}
	defer cl.Close()
	a, b := cl.Nodes[0], cl.Nodes[1]
	fmt.Fprintf(w, "agents: %s on %s, %s on %s (soft RDMA over UDP, gRPC control plane), %d pollers each\n",
		a.Name, a.IP, b.Name, b.IP, a.Agent.Engine().Config().Pollers)
	sockA, err := a.Allocate(ctx, "demo-client", o.VConns)
	if err != nil {
		return err
	}
	sockB, err := b.Allocate(ctx, "demo-server", o.VConns)
	if err != nil {
		return err
	}
	ca, err := vconn.NewClient(ctx, vconn.Options{Socket: sockA})
	if err != nil {
		return err
	}
	defer ca.Close()
	cb, err := vconn.NewClient(ctx, vconn.Options{Socket: sockB})
	if err != nil {
		return err
	}
	defer cb.Close()

	ln, err := cb.Listen(ctx, ":7")
	if err != nil {
		return err
	}
	defer ln.Close()
	go echo(ctx, ln)

	stats := func() string {
		sa, sb := a.Agent.Engine().Stats(), b.Agent.Engine().Stats()
		return fmt.Sprintf("vconns open: node-a %d, node-b %d; RC QPs: node-a created %d, node-b created %d (%d in all, for %d vconns)",
			sa.VConns, sb.VConns, sa.QPs, sb.QPs, sa.QPs+sb.QPs, o.VConns)
	}
	return roundTrips(ctx, w, ca, "node-b:7", o, stats)
}

// echo answers every message on every vconn the listener accepts.
func echo(ctx context.Context, ln *vconn.Listener) {
	minicluster.Serve(ln, func(c *vconn.Conn) {
		for {
			m, err := c.RecvMsg(ctx)
			if err != nil {
				return
			}
			if err := c.SendMsg(ctx, m.Data); err != nil {
				return
			}
		}
	})
}

// roundTrips opens o.VConns vconns to addr, ping-pongs on all of them from
// o.Workers goroutines and prints what it measured; stats describes the
// engines once the vconns are open.
func roundTrips(ctx context.Context, w io.Writer, ca *vconn.Client, addr string, o AgentsOptions, stats func() string) error {
	start := time.Now()
	conns := make([]*vconn.Conn, o.VConns)
	if err := parallel(o.Workers, o.VConns, func(i int) error {
		c, err := ca.Dial(ctx, addr)
		conns[i] = c
		return err
	}); err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	fmt.Fprintf(w, "opened %d vconns in %v\n", o.VConns, time.Since(start).Round(time.Millisecond))
	fmt.Fprintln(w, stats())

	lat := make([][]time.Duration, o.Workers)
	var msgs atomic.Int64
	start = time.Now()
	var mu sync.Mutex
	if err := parallel(o.Workers, o.VConns, func(i int) error {
		c := conns[i]
		var mine []time.Duration
		msg := make([]byte, o.Size)
		for k := 0; k < o.Messages; k++ {
			// Every message differs (by vconn and round), and every echo
			// is checked byte for byte.
			for j := range msg {
				msg[j] = byte(i*31 + k*7 + j)
			}
			t0 := time.Now()
			if err := c.SendMsg(ctx, msg); err != nil {
				return err
			}
			m, err := c.RecvMsg(ctx)
			if err != nil {
				return err
			}
			mine = append(mine, time.Since(t0))
			if !bytes.Equal(m.Data, msg) {
				return fmt.Errorf("vconn %d round %d: echo of %d bytes came back as %d different bytes", i, k, len(msg), len(m.Data))
			}
		}
		msgs.Add(int64(2 * o.Messages))
		mu.Lock()
		lat[i%o.Workers] = append(lat[i%o.Workers], mine...)
		mu.Unlock()
		return nil
	}); err != nil {
		return fmt.Errorf("ping-pong: %w", err)
	}
	el := time.Since(start)
	all := slices.Concat(lat...)
	slices.Sort(all)
	q := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	fmt.Fprintf(w, "%d round trips of %d bytes on %d vconns (%d concurrent), every byte checked: %.0f messages/s, latency p50 %v p99 %v\n",
		len(all), o.Size, o.VConns, o.Workers, float64(msgs.Load())/el.Seconds(), q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond))
	var errs []error
	for _, c := range conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// parallel runs fn(0..n-1) on w goroutines; the first error wins.
func parallel(w, n int, fn func(int) error) error {
	var next atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	for g := 0; g < w; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}
