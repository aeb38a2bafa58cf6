package vconn_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

const oneWay = 1 // first byte of a message the echo does not answer

// e4Path is one way from a pod to its peer in BenchmarkE4Paired.
type e4Path struct {
	name string
	c    msgConn
	rtts []time.Duration // every round trip measured
	rate []float64       // one-way messages/s of each round
}

// BenchmarkE4Paired measures the three paths of E4 in turns, in one
// process: each round runs a batch of round trips and a burst of one-way
// messages on every path, in a rotating order, so a change in the
// machine's load (other work on its two cores) hits all paths alike. It
// reports each path's median round trip over every round and the median
// over rounds of the one-way rate ratios, as the targets are stated.
func BenchmarkE4Paired(b *testing.B) {
	msg := make([]byte, 64)
	ow := make([]byte, 64) // one-way: not answered
	ow[0] = oneWay
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var paths []*e4Path
	for _, p := range []struct {
		name string
		pair func(*testing.B) (msgConn, msgConn)
	}{{"socket", sdkPair}, {"shm", shmPairB}, {"engine", enginePair}} {
		c, s := p.pair(b)
		go func() { // echoes round trips and the last message of a burst
			for {
				k, err := s.recvFirst(ctx)
				if err != nil || (k != oneWay && s.send(ctx, msg) != nil) {
					return
				}
			}
		}()
		paths = append(paths, &e4Path{name: p.name, c: c})
	}
	const rtts, burst = 100, 1000
	round := func(p *e4Path, record bool) {
		for i := 0; i < rtts; i++ {
			t0 := time.Now()
			if err := p.c.send(ctx, msg); err != nil {
				b.Fatal(err)
			}
			if err := p.c.recv(ctx); err != nil {
				b.Fatal(err)
			}
			if record {
				p.rtts = append(p.rtts, time.Since(t0))
			}
		}
		// One-way: until the peer has the burst's last message, which
		// alone it answers.
		t0 := time.Now()
		for i := 0; i < burst; i++ {
			m := ow
			if i == burst-1 {
				m = msg
			}
			if err := p.c.send(ctx, m); err != nil {
				b.Fatal(err)
			}
		}
		if err := p.c.recv(ctx); err != nil {
			b.Fatal(err)
		}
		if record {
			p.rate = append(p.rate, burst/time.Since(t0).Seconds())
		}
	}
	for _, p := range paths { // warm up
		round(p, false)
	}
	b.ResetTimer()
	for r := 0; r < b.N; r++ {
		for i := range paths {
			round(paths[(r+i)%len(paths)], true)
		}
	}
	b.StopTimer()
	p50 := map[string]float64{}
	for _, p := range paths {
		slices.Sort(p.rtts)
		p50[p.name] = float64(p.rtts[len(p.rtts)/2].Nanoseconds()) / 1e3
		b.ReportMetric(p50[p.name], "p50-µs/rtt-"+p.name)
	}
	ratio := func(a, z *e4Path) float64 {
		rs := make([]float64, len(a.rate))
		for i := range rs {
			rs[i] = a.rate[i] / z.rate[i]
		}
		slices.Sort(rs)
		return rs[len(rs)/2]
	}
	b.ReportMetric(p50["socket"]/p50["shm"], "socket/shm-p50")
	b.ReportMetric(p50["shm"]/p50["engine"], "shm/engine-p50")
	b.ReportMetric(ratio(paths[1], paths[2]), "shm/engine-rate")
	b.ReportMetric(ratio(paths[0], paths[2]), "socket/engine-rate")
	_ = fmt.Sprint
}
