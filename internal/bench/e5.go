package bench

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/engine"
	"github.com/rdmavisor/rdmavisor/internal/engine/wire"
)

// e5Transports are the policies E5 compares, in output order.
var e5Transports = []engine.Transport{engine.RC, engine.UC, engine.UD, engine.Auto}

// engineHeaderLen is the engine's per-message header (engine/wire):
// a UD datagram carries at most one MTU less this. softMTU is the soft
// devices' active MTU, which the engines take.
const (
	engineHeaderLen = wire.HeaderLen
	softMTU         = 4096
)

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
	return nil
}

func e5Once(ctx context.Context, e *env, t engine.Transport, size int) (_ rate, err error) {
	// UD's limit depends on the path MTU, which is the device's: 4096
	// on the soft provider unless configured otherwise.
	if udMax := softMTU - engineHeaderLen; t == engine.UD && size > udMax {
		return rate{}, fmt.Errorf("UD carries at most %d bytes (one %d-byte MTU less the %d-byte header)", udMax, softMTU, engineHeaderLen)
	}
	ctx, cancel := context.WithTimeout(ctx, e.Plan.Timeout)
	defer cancel()
	tb, err := openTestbed(e.wireFor("e5"))
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
	return drive(ctx, senders, 1, msg, rx, e.Plan.Warmup, e.Plan.Measure)
}
