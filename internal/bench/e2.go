package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
)

// runE2 measures the memory one connection costs: for each count, the
// process's growth from opening the connections (both ends live in this
// process), after a full GC, divided by 2×count, so a figure is per vconn
// end, what one node's agent holds per connection. Growth is the live Go
// heap plus memory mapped outside it (registered regions, which a hardware
// provider pins); the resident growth is reported too.
func runE2(ctx context.Context, e *env) error {
	for _, d := range []string{designEngine, designNaive} {
		ns := e.Plan.E2EngineVConns
		if d == designNaive {
			ns = e.Plan.E2NaiveVConns
		}
		var est estimator
		var failed error
		for _, n := range ns {
			rec := Record{Suite: "e2", Design: d, VConns: n}
			err := failed
			if err == nil {
				err = e.admit(d, n, est)
			}
			if err == nil {
				e.Log.Info("Measuring", "suite", "e2", "design", d, "vconns", n)
				var grown memSample
				grown, err = e2Once(ctx, e, d, n, &rec)
				est.observe(n, grown)
			}
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if failed == nil && !errors.Is(err, errOverBudget) {
					failed = fmt.Errorf("not run: %s failed at %d connections", d, n)
				}
				rec = errLine(rec, err)
			}
			if err := e.emit(rec); err != nil {
				return err
			}
		}
	}
	return nil
}

func e2Once(ctx context.Context, e *env, name string, n int, rec *Record) (grown memSample, err error) {
	ctx, cancel := context.WithTimeout(ctx, e.Plan.Timeout)
	defer cancel()
	tb, err := openTestbed(e.wireFor("e2"))
	if err != nil {
		return memSample{}, err
	}
	s0, err := sampleMemory()
	if err != nil {
		return memSample{}, errors.Join(err, tb.close())
	}
	d, err := openDesign(name, tb, &counter{})
	if err != nil {
		return memSample{}, errors.Join(err, tb.close())
	}
	defer func() {
		if cerr := errors.Join(d.close(), tb.close()); cerr != nil && err == nil {
			err = fmt.Errorf("tear down: %w", cerr)
		}
	}()
	s1, err := sampleMemory()
	if err != nil {
		return memSample{}, err
	}
	senders, err := openPairs(ctx, d, n)
	if err != nil {
		return memSample{}, err
	}
	s2, err := sampleMemory()
	if err != nil {
		return memSample{}, err
	}
	runtime.KeepAlive(senders)
	fixed, g := s1.sub(s0), s2.sub(s1)
	ends := float64(2 * n)
	rec.QPs = d.qps()
	rec.BytesPerVConn = ptr(round(float64(g.Heap+g.Mapped)/ends, 1))
	rec.HeapBytesPerVConn = ptr(round(float64(g.Heap)/ends, 1))
	rec.MappedBytesPerVConn = ptr(round(float64(g.Mapped)/ends, 1))
	rec.RSSBytesPerVConn = ptr(round(float64(g.RSS)/ends, 1))
	rec.Per = "vconn end"
	rec.FixedBytes = ptr(fixed.Heap + fixed.Mapped)
	// The budget is judged on heap plus registered memory, which a
	// hardware provider pins (the soft one maps it lazily).
	return memSample{RSS: g.Heap + g.Mapped, Maps: g.Maps}, nil
}
