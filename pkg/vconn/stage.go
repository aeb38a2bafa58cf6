package vconn

import (
	"context"
	"net"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// A vconn's one-sided operations on the peer's regions (WriteRegion,
// ReadRegion) carry their bytes in staging memory where the agent offers
// it (frame.FeatureStage): stageSize bytes asked for on the first one, in
// stageSlots slots. Each piece of an operation, of at most a slot, takes a
// slot, so that many of the vconn's goroutines copy and wait at once.
const (
	stageSize  = 256 << 10
	stageSlots = 4
)

// stage is a vconn's staging memory (frame.OpStage): a memfd the agent
// registered and this process maps. A WRITE's bytes are copied into a slot
// and the agent posts the RDMA WRITE from there; a READ lands in a slot and
// is copied out. A slot is its operation's from the copy in until the
// agent answered, even when the caller gave up waiting: the agent may
// still be using it.
type stage struct {
	slot int      // bytes per slot
	free chan int // offsets of the free slots

	mu  sync.RWMutex // held shared while a copy touches mem, exclusively to unmap it
	mem []byte       // nil once unmapped; guarded by mu
	err error        // why mem was unmapped; guarded by mu
}

func newStage(mem []byte) *stage {
	st := &stage{mem: mem, slot: len(mem) / stageSlots, free: make(chan int, stageSlots)}
	for i := range stageSlots {
		st.free <- i * st.slot
	}
	return st
}

// staging returns the vconn's staging memory, asking the agent for it on
// first use: nil where the agent offers none, refused it or passed memory
// this process could not map (the bytes then travel in frames), and
// ctx's error if ctx ends before the agent answered. A vconn asks once,
// and takes the answer whoever waits for it: memory the agent made is
// never left unknown here (a second ask would be refused).
func (c *Conn) staging(ctx context.Context) (*stage, error) {
	if st := c.stg.Load(); st != nil {
		return st, nil
	}
	if c.s.features&frame.FeatureStage == 0 {
		return nil, nil
	}
	c.stgMu.Lock()
	asked := c.stgAsked
	if asked == nil {
		asked = make(chan struct{})
		c.stgAsked = asked
		go c.askStage(asked)
	}
	c.stgMu.Unlock()
	select {
	case <-asked:
		return c.stg.Load(), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// askStage asks the agent for staging memory and maps what it passes,
// then closes asked.
func (c *Conn) askStage(asked chan struct{}) {
	if err := c.acquire(context.Background(), nil); err != nil {
		close(asked) // the vconn or the session ended
		return
	}
	f := &frame.Frame{Op: frame.OpStage, Handle: c.h, Arg2: stageSize}
	err := c.s.async(f, func(rep frame.Frame, err error) {
		// On the reader goroutine, which owns the frame's descriptors.
		var fds []int
		if err == nil {
			fds, c.s.rights = c.s.rights, nil
			c.install(rep, fds)
		}
		shm.CloseFDs(fds)
		c.release()
		close(asked)
	})
	if err != nil {
		c.release()
		close(asked)
	}
}

// install maps the staging memory of Stage's OK, rep, whose descriptors
// are fds (the caller's to close), and makes it the vconn's.
func (c *Conn) install(rep frame.Frame, fds []int) {
	size := int(rep.Arg2)
	if len(fds) != 1 || size < stageSlots || size > stageSize {
		return
	}
	mem, err := shm.MapMemfd(fds[0], size)
	if err != nil {
		return
	}
	st := newStage(mem)
	c.mu.Lock()
	closed := c.unmapped
	if !closed {
		c.stg.Store(st) // unmapRegions finds it under mu
	}
	c.mu.Unlock()
	if closed {
		st.unmap(net.ErrClosed)
	}
}

// take waits for a free slot and returns its offset.
func (st *stage) take(ctx context.Context, c *Conn) (int, error) {
	select {
	case at := <-st.free:
		return at, nil
	default:
	}
	select {
	case at := <-st.free:
		return at, nil
	case <-c.closing:
		return 0, net.ErrClosed
	case <-c.s.done:
		return 0, c.s.failure()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func (st *stage) put(at int) { st.free <- at }

// copyAt copies p into the slot at at, or (read) the slot into p.
func (st *stage) copyAt(p []byte, at int, read bool) error {
	st.mu.RLock()
	defer st.mu.RUnlock()
	if st.mem == nil {
		return st.err
	}
	if read {
		copy(p, st.mem[at:])
	} else {
		copy(st.mem[at:], p)
	}
	return nil
}

// unmap ends the mapping once no copy is inside it; later copies fail
// with err.
func (st *stage) unmap(err error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.mem == nil {
		return
	}
	_ = shm.Unmap(st.mem)
	st.mem, st.err = nil, err
}

// staged runs WriteRegion (read false) or ReadRegion through the vconn's
// staging memory; staged is false where it has none, and the caller sends
// the bytes in frames.
func (c *Conn) staged(ctx context.Context, id uint32, off uint64, data []byte, read bool) (staged bool, err error) {
	if len(data) == 0 {
		return false, nil
	}
	st, err := c.staging(ctx)
	switch {
	case err != nil:
		return true, err
	case st == nil:
		return false, nil
	}
	return true, c.oneSided(ctx, st, id, off, data, read)
}

// oneSided runs WriteRegion (read false: data into the peer's region) or
// ReadRegion (read: the region into data) through staging memory, in
// pieces of at most a slot.
func (c *Conn) oneSided(ctx context.Context, st *stage, id uint32, off uint64, data []byte, read bool) error {
	op := frame.OpWrite
	if read {
		op = frame.OpRead
	}
	for done := 0; done < len(data); {
		n := min(len(data)-done, st.slot)
		at, err := st.take(ctx, c)
		if err != nil {
			return err
		}
		p := data[done : done+n]
		if !read {
			if err := st.copyAt(p, at, false); err != nil {
				st.put(at)
				return err
			}
		}
		f := &frame.Frame{Op: op, Flags: frame.FlagMemfd, Arg: id, Arg2: off + uint64(done), Payload: frame.AppendStaged(nil, uint32(at), uint32(n))}
		if err := c.stagedOp(ctx, st, at, f, p, read); err != nil {
			return err
		}
		done += n
	}
	return nil
}

// stagedOp sends f, an operation on the slot at at, and waits for its
// answer; a read's bytes are then copied out into p. The slot, and the
// operation's place in the send window, are given back once the agent
// answered: by the caller, or, if it stops waiting, when the answer (or
// the session's end) comes.
func (c *Conn) stagedOp(ctx context.Context, st *stage, at int, f *frame.Frame, p []byte, read bool) error {
	done := func() {
		st.put(at)
		c.release()
	}
	if c.isClosed() {
		st.put(at)
		return net.ErrClosed
	}
	if err := c.acquire(ctx, nil); err != nil {
		st.put(at)
		return err
	}
	f.Handle = c.h
	answer := make(chan error, 1)
	if err := c.s.async(f, func(_ frame.Frame, err error) { answer <- err }); err != nil {
		done()
		return err
	}
	select {
	case err := <-answer:
		if err == nil && read {
			err = st.copyAt(p, at, true)
		}
		done()
		return err
	case <-ctx.Done():
		go func() {
			<-answer
			done()
		}()
		return ctx.Err()
	}
}
