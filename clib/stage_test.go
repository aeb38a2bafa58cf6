package clib_test

import (
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// TestCStage runs test/test_stage.c against the agents: one-sided
// operations of several sizes and threads, whose bytes the peer finds in
// its region, through the staging memory a's vconn maps (the program
// counts its staging memfds).
func TestCStage(t *testing.T) {
	out := runOnTwoNodes(t, "test_stage", "stg", 4, "7008")
	if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
		t.Fatal("test_stage did not finish")
	}
}

// stageCounts is what the fake agent of TestCStageFake saw.
type stageCounts struct {
	stages, stagedWrites, stagedReads, frameWrites, frameReads atomic.Int64
	overlaps, badSpans, maxInFlight                            atomic.Int64
}

// How the fake agent answers Stage.
const (
	stageSealed = iota
	stageRefused
	stageUnsealed
)

// slowOff is test_stage.c's SLOW_OFF: the fake agent answers a Write
// there only after slowFor, past the client's timeout.
const (
	slowOff = 777
	slowFor = 1800 * time.Millisecond
)

// TestCStageFake runs test/test_stage.c against a fake agent that sees
// each frame: where the agent offers FeatureStage, vconn_write_remote
// and vconn_read_remote ask for staging memory once per vconn and carry
// their bytes there (Write and Read with FlagMemfd and a span), never in
// frames, and no slot is used by two operations at once, nor reused
// before the agent answered an operation its caller gave up on; where it
// offers none, refuses Stage or passes memory the client cannot map,
// the bytes travel in frames, as before.
func TestCStageFake(t *testing.T) {
	for _, tc := range []struct {
		name     string
		features frame.Features
		stage    int
	}{
		{"staged", frame.FeatureMemfd | frame.FeatureStage, stageSealed},
		{"no FeatureStage", frame.FeatureMemfd, stageSealed},
		{"Stage refused", frame.FeatureStage, stageRefused},
		{"memfd unsealed", frame.FeatureStage, stageUnsealed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n stageCounts
			sock := fakeAgent(t, func(c *net.UnixConn) { serveStage(t, c, tc.features, tc.stage, &n) })
			env := []string{"VCONN_SOCK=" + sock}
			staged := tc.features&frame.FeatureStage != 0 && tc.stage == stageSealed
			if staged {
				env = append(env, "VCONN_ABANDON=1")
			}
			out := runC(t, "test_stage", env...)
			if !strings.HasSuffix(strings.TrimSpace(out), "ok") {
				t.Fatal("test_stage did not finish")
			}
			t.Logf("Stage %d, staged Write %d, Read %d, in frames Write %d, Read %d; at most %d staged operations unanswered",
				n.stages.Load(), n.stagedWrites.Load(), n.stagedReads.Load(), n.frameWrites.Load(), n.frameReads.Load(), n.maxInFlight.Load())
			if o, b := n.overlaps.Load(), n.badSpans.Load(); o != 0 || b != 0 {
				t.Errorf("%d operations on a slot another unanswered one held, %d spans outside the staging memory", o, b)
			}
			wantStages := int64(0)
			switch {
			case staged:
				wantStages = 2 // the vconn of each of the program's two clients
			case tc.features&frame.FeatureStage != 0:
				wantStages = 1
			}
			if got := n.stages.Load(); got != wantStages {
				t.Errorf("Stage asked %d times, want %d", got, wantStages)
			}
			if staged {
				if n.frameWrites.Load() != 0 || n.frameReads.Load() != 0 || n.stagedWrites.Load() == 0 || n.stagedReads.Load() == 0 {
					t.Errorf("bytes in frames where staging memory was given")
				}
				if n.maxInFlight.Load() < 2 {
					t.Errorf("never two staged operations unanswered at once: the slots are not used side by side")
				}
			} else if n.stagedWrites.Load() != 0 || n.stagedReads.Load() != 0 || n.frameWrites.Load() == 0 || n.frameReads.Load() == 0 {
				t.Errorf("staged operations without staging memory")
			}
		})
	}
}

// fakeOp is a Write or Read the fake agent runs in order, as the agent
// runs a vconn's operations.
type fakeOp struct {
	f     frame.Frame
	stage []byte // the staging memory, where f has FlagMemfd
	at, n uint32 // its span
}

// serveStage is the fake agent of TestCStageFake on one connection: a
// region 1 of 1 MiB that Write and Read reach, in frames or through
// staging memory.
func serveStage(t *testing.T, c *net.UnixConn, features frame.Features, how int, n *stageCounts) {
	var mu sync.Mutex
	inFlight := map[uint32]uint32{} // staged spans unanswered: offset, length
	ops := make(chan fakeOp, 64)
	reply := func(f frame.Frame, fds ...int) {
		var oob []byte
		if len(fds) > 0 {
			oob = unix.UnixRights(fds...)
		}
		_, _, _ = c.WriteMsgUnix(encode(t, f), oob, nil)
	}
	ran := make(chan struct{})
	go func() {
		defer close(ran)
		runStaged(ops, n, func(op fakeOp) {
			mu.Lock()
			delete(inFlight, op.at)
			mu.Unlock()
		}, reply)
	}()
	var stage []byte
	defer func() {
		close(ops)
		<-ran // no copy is left in the staging memory
		if stage != nil {
			_ = unix.Munmap(stage)
		}
	}()
	b := make([]byte, frame.MaxFrame)
	for {
		k, err := c.Read(b)
		if err != nil {
			return
		}
		f, err := frame.Decode(b[:k])
		if err != nil {
			return
		}
		f.Payload = append([]byte(nil), f.Payload...) // b is read again meanwhile
		switch f.Op {
		case frame.OpHello:
			reply(frame.Frame{Op: frame.OpOK, Req: f.Req, Arg: frame.Version, Arg2: uint64(features),
				Payload: frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "fake"})})
		case frame.OpDial:
			reply(frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: 1, Payload: f.Payload})
		case frame.OpGrant:
		case frame.OpStage:
			n.stages.Add(1)
			var fd int
			if stage, fd = fakeStage(t, f, how, stage); fd < 0 {
				reply(frame.Frame{Op: frame.OpError, Req: f.Req, Handle: f.Handle, Arg: uint32(frame.CodeLimit), Payload: []byte("no staging memory")})
				continue
			}
			reply(frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle, Arg2: uint64(len(stage))}, fd)
			_ = unix.Close(fd)
		case frame.OpWrite, frame.OpRead:
			op := fakeOp{f: f}
			if f.Flags&frame.FlagMemfd != 0 {
				op.stage = stage
				if op.at, op.n, err = frame.DecodeStaged(f.Payload); err != nil || stage == nil || int(op.at)+int(op.n) > len(stage) {
					n.badSpans.Add(1)
					reply(frame.Frame{Op: frame.OpError, Req: f.Req, Handle: f.Handle, Arg: uint32(frame.CodeBadRequest), Payload: []byte("bad span")})
					continue
				}
				mu.Lock()
				for at, l := range inFlight {
					if op.at < at+l && at < op.at+op.n {
						n.overlaps.Add(1)
					}
				}
				inFlight[op.at] = op.n
				if k := int64(len(inFlight)); k > n.maxInFlight.Load() {
					n.maxInFlight.Store(k)
				}
				mu.Unlock()
			}
			ops <- op
		default:
			reply(frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle})
		}
	}
}

// fakeStage makes the staging memory of Stage f as how says: the memory
// mapped here and the memfd to pass, or -1 to refuse it.
func fakeStage(t *testing.T, f frame.Frame, how int, old []byte) ([]byte, int) {
	if how == stageRefused || old != nil || f.Arg2 == 0 {
		return old, -1
	}
	size := int(min(f.Arg2, 256<<10))
	fd, err := unix.MemfdCreate("fake-stage", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err == nil {
		err = unix.Ftruncate(fd, int64(size))
	}
	if err == nil && how == stageSealed {
		_, err = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL)
	}
	var mem []byte
	if err == nil {
		mem, err = unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	}
	if err != nil {
		t.Error(err) // on the fake agent's goroutine: no Fatal
		return old, -1
	}
	return mem, fd
}

// runStaged runs the operations in order on a region of 1 MiB; done
// takes a staged one off the spans in flight before its answer goes
// (after which the client may use its slot again).
func runStaged(ops <-chan fakeOp, n *stageCounts, done func(fakeOp), reply func(frame.Frame, ...int)) {
	region := make([]byte, 1<<20)
	for op := range ops {
		f := op.f
		if f.Op == frame.OpWrite && f.Arg2 == slowOff {
			time.Sleep(slowFor)
		}
		size := uint64(op.n)
		switch {
		case op.stage == nil && f.Op == frame.OpWrite:
			n.frameWrites.Add(1)
			size = uint64(len(f.Payload))
		case op.stage == nil:
			n.frameReads.Add(1)
			l, _ := frame.DecodeLength(f.Payload)
			size = uint64(l)
		case f.Op == frame.OpWrite:
			n.stagedWrites.Add(1)
		default:
			n.stagedReads.Add(1)
		}
		rep := frame.Frame{Op: frame.OpOK, Req: f.Req, Handle: f.Handle}
		if f.Arg != 1 || f.Arg2 > uint64(len(region)) || size > uint64(len(region))-f.Arg2 {
			rep = frame.Frame{Op: frame.OpError, Req: f.Req, Handle: f.Handle, Arg: uint32(frame.CodeRegion), Payload: []byte("outside the region")}
		} else {
			span := region[f.Arg2 : f.Arg2+size]
			switch {
			case op.stage == nil && f.Op == frame.OpWrite:
				copy(span, f.Payload)
			case op.stage == nil:
				rep.Payload = span
			case f.Op == frame.OpWrite:
				copy(span, op.stage[op.at:op.at+op.n])
			default:
				copy(op.stage[op.at:op.at+op.n], span)
			}
		}
		if op.stage != nil {
			done(op)
		}
		reply(rep)
	}
}
