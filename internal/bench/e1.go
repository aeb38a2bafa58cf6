package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
)

// runE1 measures messages per second against the number of connections,
// for the engine and the naive design: E1VConns connections from device a
// to device b, 64-byte messages sent round-robin over all of them from
// Plan.Producers goroutines, every message released on arrival; each
// endpoint polls with Plan.Pollers goroutines. Each count runs on devices
// without and with the soft provider's NIC model (Plan.E1NICModels), which
// makes the naive design's QP per connection cost what a NIC's QP-context
// cache and receive ring make it cost.
//
// The counts are measured in Plan.Repeats passes over all of them, the two
// designs alternating at each, rather than each count's runs back to back:
// a machine's speed can change for tens of seconds at a time (seen here:
// every rate halving at once), and a ratio of two counts, each measured in
// one burst, would mostly measure that. A line reports the median of its
// count's runs, one from each pass.
//
// The first pass goes up in count. Before each count the memory it would
// make resident is estimated from the growth per connection measured at a
// smaller count (traffic included, so touched receive buffers count); a
// count whose estimate exceeds the budget, or that needs more file
// descriptors than the process may open, is reported as an error line
// instead of run. So is every count above one that failed, in any pass.
func runE1(ctx context.Context, e *env) error {
	models := e.Plan.E1NICModels
	if len(models) == 0 {
		models = []bool{false}
	}
	// A variant is a design on devices with or without the NIC model.
	type variant struct {
		design string
		nic    bool
	}
	var vs []variant
	for _, m := range models {
		for _, d := range []string{designEngine, designNaive} {
			vs = append(vs, variant{d, m})
		}
	}
	// One estimator per design, whatever the model: resident memory does
	// not shrink between runs, so the second variant at a count sees less
	// growth than it needs; the estimate keeps the larger.
	est := map[string]*estimator{}
	for _, v := range vs {
		est[v.design] = &estimator{}
	}
	// lines[i][v] is the series of count E1VConns[i] for variant v.
	lines := make([]map[variant]*series, len(e.Plan.E1VConns))
	// failed[v] says why variant v's counts above its first failure are
	// not run.
	failed := map[variant]error{}
	failAbove := func(v variant, i int) {
		if failed[v] == nil {
			failed[v] = fmt.Errorf("not run: %s failed at %d connections", v.design, e.Plan.E1VConns[i])
		}
		for j := i + 1; j < len(lines); j++ {
			if lines[j] != nil && lines[j][v].err == nil {
				lines[j][v].err = failed[v]
			}
		}
	}
	for rep := 0; rep < e.Plan.Repeats; rep++ {
		for i, n := range e.Plan.E1VConns {
			if rep == 0 {
				lines[i] = map[variant]*series{}
				for _, v := range vs {
					s := &series{rec: Record{Suite: "e1", Design: v.design, NICModel: v.nic, VConns: n, MsgBytes: e.Plan.MsgBytes, Pollers: e.Plan.Pollers}}
					s.err = failed[v]
					if s.err == nil {
						s.err = e.admit(v.design, n, *est[v.design])
					}
					lines[i][v] = s
				}
			}
			for _, v := range vs {
				s := lines[i][v]
				if s.err != nil {
					continue
				}
				e.Log.Info("Measuring", "suite", "e1", "design", v.design, "nicModel", v.nic, "vconns", n, "run", rep+1)
				r, grown, err := e1Once(ctx, e, v.design, v.nic, n, &s.rec)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				s.add(r, err)
				if err != nil {
					failAbove(v, i)
				} else if rep == 0 {
					est[v.design].observe(n, grown)
				}
			}
		}
	}
	for i := range lines {
		for _, v := range vs {
			if err := e.emit(lines[i][v].record(false)); err != nil {
				return err
			}
		}
	}
	return nil
}

// e1Once runs one count and fills in rec's QPs and setup time; it returns
// the rate and what the run grew by.
func e1Once(ctx context.Context, e *env, name string, nic bool, n int, rec *Record) (_ rate, grown memSample, err error) {
	ctx, cancel := context.WithTimeout(ctx, e.Plan.Timeout)
	defer cancel()
	before, err := sampleMemory()
	if err != nil {
		return rate{}, memSample{}, err
	}
	tb, err := openTestbedNIC(e.wireFor("e1"), nic)
	if err != nil {
		return rate{}, memSample{}, err
	}
	rx := &counter{}
	d, err := openDesignPollers(name, tb, rx, e.Plan.Pollers)
	if err != nil {
		return rate{}, memSample{}, errors.Join(err, tb.close())
	}
	defer func() {
		start := time.Now()
		if cerr := errors.Join(d.close(), tb.close()); cerr != nil && err == nil {
			err = fmt.Errorf("tear down: %w", cerr)
		}
		e.Log.V(1).Info("Torn down", "seconds", time.Since(start).Seconds())
	}()
	start := time.Now()
	senders, err := openPairs(ctx, d, n)
	if err != nil {
		return rate{}, memSample{}, err
	}
	rec.SetupSeconds = round(time.Since(start).Seconds(), 3)
	rec.QPs = d.qps()
	msg := make([]byte, e.Plan.MsgBytes)
	for i := range msg {
		msg[i] = byte(i)
	}
	s0 := [2]soft.StatsSnapshot{tb.devs[0].Stats(), tb.devs[1].Stats()}
	var stalls0 uint64
	if ed, ok := d.(*engineDesign); ok {
		stalls0 = ed.a.Stats().CreditStalls
	}
	r, err := drive(ctx, senders, e.Plan.Producers, msg, rx, e.Plan.Warmup, e.Plan.Measure)
	if err != nil {
		return rate{}, memSample{}, err
	}
	if ed, ok := d.(*engineDesign); ok {
		// Why the engine's rate moves with the count (-v 1): a sender
		// waiting for its peer's credits is the engine's own limit.
		e.Log.V(1).Info("Engine", "nicModel", nic, "vconns", n, "creditStalls", ed.a.Stats().CreditStalls-stalls0)
	}
	for i, d := range tb.devs {
		s1 := d.Stats()
		e.Log.V(1).Info("Device", "design", name, "nicModel", nic, "vconns", n, "device", i, "rxPackets", s1.RxPackets-s0[i].RxPackets,
			"ringDrops", s1.RxRingDrops-s0[i].RxRingDrops, "qpCacheMisses", s1.QPCacheMisses-s0[i].QPCacheMisses,
			"timeouts", s1.Timeouts-s0[i].Timeouts, "retransmits", s1.Retransmits-s0[i].Retransmits)
	}
	after, err := sampleMemory()
	if err != nil {
		return rate{}, memSample{}, err
	}
	return r, after.sub(before), nil
}

// errOverBudget marks a count not run to protect the machine.
var errOverBudget = errors.New("not run")

// estimator predicts the resident memory and the memory mappings of n
// connections from the largest count measured so far (at least 100, where
// fixed costs no longer dominate), the larger of what the runs at that
// count grew by.
type estimator struct {
	perConn, mapsPerConn float64
	at                   int
}

func (s *estimator) observe(n int, grown memSample) {
	if n < 100 || n < s.at || grown.RSS <= 0 {
		return
	}
	if n > s.at {
		s.perConn, s.mapsPerConn, s.at = 0, 0, n
	}
	s.perConn = max(s.perConn, float64(grown.RSS)/float64(n))
	s.mapsPerConn = max(s.mapsPerConn, float64(grown.Maps)/float64(n))
}

// admit says whether n connections of design d may run: within the memory
// budget, and within the kernel's limit on a process's memory mappings
// (vm.max_map_count; past it munmap fails too, so a run could not even be
// torn down).
func (e *env) admit(d string, n int, est estimator) error {
	if est.at == 0 {
		return nil
	}
	if need := est.perConn * float64(n); need > float64(e.Budget) {
		return fmt.Errorf("%w: %d %s connections would need about %.2f GiB resident (%.0f bytes per connection measured at %d), over the budget of %.2f GiB (--budget-bytes)",
			errOverBudget, n, d, need/(1<<30), est.perConn, est.at, float64(e.Budget)/(1<<30))
	}
	if limit, err := readUint("/proc/sys/vm/max_map_count"); err == nil {
		if need := est.mapsPerConn * float64(n); need > 0.9*float64(limit) {
			return fmt.Errorf("%w: %d %s connections would need about %.0f memory mappings (%.1f per connection measured at %d), over 90%% of vm.max_map_count (%d)",
				errOverBudget, n, d, need, est.mapsPerConn, est.at, limit)
		}
	}
	return nil
}
