package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/engine/format"
	"github.com/rdmavisor/rdmavisor/internal/transport"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft"
	softwire "github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// e5Transports are the policies E5 compares, in output order.
var e5Transports = []transport.Kind{transport.RC, transport.UC, transport.UD, transport.Auto}

// engineHeaderLen is the engine's per-message header (engine/format):
// a UD datagram carries at most one MTU less this. softMTU is the soft
// devices' active MTU, which the engines take.
const (
	engineHeaderLen = format.HeaderLen
	softMTU         = 4096
)

// e5LossTransports are the loss sweep's (suite "e5loss" in the records,
// run with E5): Auto against the fixed transports at small sizes
// (Plan.E5LossSizes) on the in-memory fabric dropping each packet with
// the probabilities of Plan.E5Loss. RC is the reliable baseline; UC loses
// what the wire drops, so its line is what it delivered, not a transport
// Auto could stand in for.
var e5LossTransports = []transport.Kind{transport.RC, transport.UC, transport.Auto}

// runE5 measures one vconn pair per transport and message size, on a
// fresh pair of engines each (a failure must not spill into the next
// size), one producer sending as fast as Send allows, the receiver
// releasing on arrival. At each size the transports' runs alternate,
// Plan.Repeats times. Messages UD cannot carry (larger than the MTU less
// the engine's header) are error lines; so is anything the engine refuses.
func runE5(ctx context.Context, e *env) error {
	for _, size := range e.Plan.E5Sizes {
		ss := make([]*series, len(e5Transports))
		for i, t := range e5Transports {
			ss[i] = &series{rec: Record{Suite: "e5", Transport: t.String(), MsgBytes: size}}
		}
		for rep := 0; rep < e.Plan.Repeats; rep++ {
			for i, t := range e5Transports {
				if ss[i].err != nil {
					continue
				}
				e.Log.Info("Measuring", "suite", "e5", "transport", t, "bytes", size, "run", rep+1)
				r, err := e5Once(ctx, e, t, size)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				ss[i].add(r, err)
			}
		}
		for _, s := range ss {
			if err := e.emit(s.record(true)); err != nil {
				return err
			}
		}
	}
	return runE5Loss(ctx, e)
}

// runE5Loss is the loss sweep: at each loss rate and size, the
// transports' runs alternate, Plan.Repeats times, as in runE5.
func runE5Loss(ctx context.Context, e *env) error {
	for _, loss := range e.Plan.E5Loss {
		for _, size := range e.Plan.E5LossSizes {
			ss := make([]*series, len(e5LossTransports))
			for i, t := range e5LossTransports {
				ss[i] = &series{rec: Record{Suite: "e5loss", Transport: t.String(), MsgBytes: size, Loss: ptr(loss)}}
			}
			for rep := 0; rep < e.Plan.Repeats; rep++ {
				for i, t := range e5LossTransports {
					if ss[i].err != nil {
						continue
					}
					e.Log.Info("Measuring", "suite", "e5loss", "transport", t, "bytes", size, "loss", loss, "run", rep+1)
					r, err := e5Run(ctx, e, t, size, softwire.Faults{Seed: uint64(rep + 1), Loss: loss})
					if ctx.Err() != nil {
						return ctx.Err()
					}
					ss[i].add(r, err)
				}
			}
			for _, s := range ss {
				if err := e.emit(s.record(true)); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

func e5Once(ctx context.Context, e *env, t transport.Kind, size int) (rate, error) {
	return e5Run(ctx, e, t, size, softwire.Faults{})
}

// e5Run is one E5 measurement; faults apply on the in-memory fabric only
// (the wire is the fabric unless Options.Wire says otherwise).
func e5Run(ctx context.Context, e *env, t transport.Kind, size int, faults softwire.Faults) (_ rate, err error) {
	// UD's limit depends on the path MTU, which is the device's: 4096
	// on the soft provider unless configured otherwise.
	if udMax := softMTU - engineHeaderLen; t == transport.UD && size > udMax {
		return rate{}, fmt.Errorf("UD carries at most %d bytes (one %d-byte MTU less the %d-byte header)", udMax, softMTU, engineHeaderLen)
	}
	ctx, cancel := context.WithTimeout(ctx, e.Plan.Timeout)
	defer cancel()
	var tb *testbed
	if faults.Loss > 0 {
		tb, err = openFaultyFabric(faults)
	} else {
		tb, err = openTestbed(e.wireFor("e5"))
	}
	if err != nil {
		return rate{}, err
	}
	rx := &counter{}
	d, err := openEngines(tb, engine.Config{Pollers: 1}, t, rx)
	if err != nil {
		return rate{}, errors.Join(err, tb.close())
	}
	defer func() {
		if cerr := errors.Join(d.close(), tb.close()); cerr != nil && err == nil {
			err = fmt.Errorf("tear down: %w", cerr)
		}
	}()
	if mtu := d.a.Config().MTU.Bytes(); mtu != softMTU {
		return rate{}, fmt.Errorf("path MTU %d, the harness assumes %d", mtu, softMTU)
	}
	senders, err := openPairs(ctx, d, 1)
	if err != nil {
		return rate{}, err
	}
	msg := make([]byte, size)
	for i := range msg {
		msg[i] = byte(i)
	}
	r, err := drive(ctx, senders, 1, msg, rx, e.Plan.Warmup, e.Plan.Measure)
	if st := d.a.Stats(); t == transport.Auto && faults.Loss > 0 {
		// Whether Auto's small messages moved to RC (reliable.Path).
		e.Log.Info("Auto's paths", "loss", faults.Loss, "bytes", size, "toRC", st.AutoToRC, "toUC", st.AutoToUC, "retransmits", st.Retransmits)
	}
	return r, err
}

// openFaultyFabric is openTestbed's in-memory fabric with faults.
func openFaultyFabric(f softwire.Faults) (_ *testbed, err error) {
	tb := &testbed{fabric: softwire.NewFabric(f)}
	defer func() {
		if err != nil {
			err = errors.Join(err, tb.close())
		}
	}()
	for i, a := range testbedAddrs {
		w, err := tb.fabric.Attach(verbs.GIDFromAddr(netip.MustParseAddr(a)))
		if err != nil {
			return nil, err
		}
		if tb.devs[i], err = soft.Open(soft.Config{Name: fmt.Sprintf("soft%d", i), Wire: w}); err != nil {
			return nil, errors.Join(err, w.Close())
		}
	}
	return tb, nil
}
