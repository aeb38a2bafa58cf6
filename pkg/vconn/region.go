package vconn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// Access says what the peer may do to an exported region.
type Access uint8

// Accesses (the engine's values).
const (
	AccessRead  Access = 1 << 0
	AccessWrite Access = 1 << 1
)

// Region is memory this side exported to the peer vconn. Where the agent
// offers it (frame.FeatureMemfd), the region is a memfd the agent
// registered and this process maps: ReadAt and WriteAt are memory copies,
// and what they write the peer reads with RDMA READ. Otherwise the memory
// lives in the agent, and they copy over the socket.
type Region struct {
	c    *Conn
	id   uint32
	size int

	// mu is held shared while ReadAt or WriteAt copy into mem, and
	// exclusively to unmap it: no copy ever touches unmapped memory.
	mu     sync.RWMutex
	mem    []byte // the mapping; nil on the socket, and once unmapped; guarded by mu
	mapped bool   // set before use: the region was mapped
	err    error  // why mem was unmapped; guarded by mu
}

// Export registers size bytes in the agent and exports them to the peer
// vconn, which may then Read or Write them as access allows. The export
// reaches the peer before any message sent after Export returns.
func (c *Conn) Export(ctx context.Context, size int, access Access) (*Region, error) {
	f := &frame.Frame{Op: frame.OpExport, Arg: uint32(access), Arg2: uint64(size)}
	if c.s.features&frame.FeatureMemfd == 0 || size <= 0 {
		rep, err := c.op(ctx, f)
		if err != nil {
			return nil, fmt.Errorf("vconn: export: %w", err)
		}
		return &Region{c: c, id: rep.Arg, size: size}, nil
	}
	f.Flags = frame.FlagMemfd
	rep, fds, err := c.opRights(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("vconn: export: %w", err)
	}
	r := &Region{c: c, id: rep.Arg, size: size}
	if len(fds) > 0 {
		// A memfd that does not map leaves the region on the socket,
		// where the agent reaches the same bytes.
		r.mem, _ = shm.MapMemfd(fds[0], size)
		r.mapped = r.mem != nil
	}
	shm.CloseFDs(fds)
	if r.mapped && !c.track(r) {
		r.unmap(net.ErrClosed)
	}
	return r, nil
}

// opRights is op for a reply that may carry descriptors, the caller's.
func (c *Conn) opRights(ctx context.Context, f *frame.Frame) (frame.Frame, []int, error) {
	if c.isClosed() {
		return frame.Frame{}, nil, net.ErrClosed
	}
	if err := c.acquire(ctx, nil); err != nil {
		return frame.Frame{}, nil, err
	}
	defer c.release()
	f.Handle = c.h
	return c.s.callRights(ctx, f)
}

// ID names the region to the peer.
func (r *Region) ID() uint32 { return r.id }

// Size is the region's length.
func (r *Region) Size() int { return r.size }

// Mapped reports whether the region is memory this process maps, which
// ReadAt and WriteAt copy in place, rather than memory of the agent's,
// reached over the socket.
func (r *Region) Mapped() bool { return r.mapped }

// ReadAt copies the region's bytes at off into p. It fails once the
// region or its vconn is closed, and (ErrRegion) for a range outside the
// region.
func (r *Region) ReadAt(ctx context.Context, p []byte, off int64) error {
	if r.mapped {
		return r.copyAt(p, off, false)
	}
	for done := 0; done < len(p); {
		n := min(len(p)-done, frame.MaxPayload)
		rep, err := r.c.op(ctx, &frame.Frame{Op: frame.OpLocalRead, Arg: r.id, Arg2: uint64(off) + uint64(done), Payload: frame.AppendLength(nil, uint32(n))})
		if err == nil {
			err = r.c.readReply(rep, n)
		}
		if err != nil {
			return fmt.Errorf("vconn: region %d: %w", r.id, err)
		}
		done += copy(p[done:], rep.Payload)
	}
	return nil
}

// WriteAt copies p into the region at off, as ReadAt.
func (r *Region) WriteAt(ctx context.Context, p []byte, off int64) error {
	if r.mapped {
		return r.copyAt(p, off, true)
	}
	for done := 0; done < len(p); {
		n := min(len(p)-done, frame.MaxPayload)
		if _, err := r.c.op(ctx, &frame.Frame{Op: frame.OpLocalWrite, Arg: r.id, Arg2: uint64(off) + uint64(done), Payload: p[done : done+n]}); err != nil {
			return fmt.Errorf("vconn: region %d: %w", r.id, err)
		}
		done += n
	}
	return nil
}

// copyAt is ReadAt and WriteAt on the mapping: one copy, no system call.
func (r *Region) copyAt(p []byte, off int64, write bool) error {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.mem == nil {
		return fmt.Errorf("vconn: region %d: %w", r.id, r.err)
	}
	if off < 0 || off > int64(len(r.mem)) || int64(len(p)) > int64(len(r.mem))-off {
		return fmt.Errorf("vconn: region %d: %w", r.id, &Error{Code: CodeRegion, Message: fmt.Sprintf("%d bytes at %d outside its %d", len(p), off, len(r.mem))})
	}
	if write {
		copy(r.mem[off:], p)
	} else {
		copy(p, r.mem[off:])
	}
	return nil
}

// unmap ends the mapping, once no copy is inside it; later copies fail
// with err.
func (r *Region) unmap(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.mem == nil {
		return
	}
	_ = shm.Unmap(r.mem)
	r.mem, r.err = nil, err
}

// Close withdraws the export; ReadAt and WriteAt fail from then on. Its
// memory stays registered, and counts against the allocation's limits
// (ErrLimit), until the peer confirmed it no longer uses the region: a
// round trip, or, where the confirmation cannot come (the vconn's sends
// wait for a peer that does not read), until the vconn ends and a grace
// of seconds passed.
func (r *Region) Close(ctx context.Context) error {
	if r.mapped {
		r.unmap(&Error{Code: CodeRegion, Message: "region closed"})
		r.c.untrack(r)
	}
	if _, err := r.c.op(ctx, &frame.Frame{Op: frame.OpUnexport, Arg: r.id}); err != nil {
		return fmt.Errorf("vconn: unexport region %d: %w", r.id, err)
	}
	return nil
}

// track records a mapped region, which the vconn's Close or the
// session's end unmaps; false if that already happened.
func (c *Conn) track(r *Region) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.unmapped {
		return false
	}
	if c.mapped == nil {
		c.mapped = make(map[*Region]struct{})
	}
	c.mapped[r] = struct{}{}
	return true
}

func (c *Conn) untrack(r *Region) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.mapped, r)
}

// unmapRegions unmaps the vconn's mapped regions and staging memory for
// good: their copies fail with err from then on. The vconn's Close and
// the session's end call it: a program that never closes its regions
// leaks no mapping.
func (c *Conn) unmapRegions(err error) {
	c.mu.Lock()
	rs := c.mapped
	c.mapped, c.unmapped = nil, true
	st := c.stg.Load()
	c.mu.Unlock()
	for r := range rs {
		r.unmap(err)
	}
	if st != nil {
		st.unmap(err)
	}
}

// WriteRegion writes data into the peer's region id at off with RDMA
// WRITE, returning once it is placed. Where the agent offers it, data is
// copied into the vconn's staging memory, which the agent registered, and
// the RDMA WRITE posted from there: no byte of it crosses the socket.
func (c *Conn) WriteRegion(ctx context.Context, id uint32, off uint64, data []byte) error {
	if staged, err := c.staged(ctx, id, off, data, false); staged {
		if err != nil {
			return fmt.Errorf("vconn: write region %d: %w", id, err)
		}
		return nil
	}
	for done := 0; done < len(data); {
		n := min(len(data)-done, frame.MaxPayload)
		if _, err := c.op(ctx, &frame.Frame{Op: frame.OpWrite, Arg: id, Arg2: off + uint64(done), Payload: data[done : done+n]}); err != nil {
			return fmt.Errorf("vconn: write region %d: %w", id, err)
		}
		done += n
	}
	return nil
}

// ReadRegion reads len(dst) bytes of the peer's region id at off with
// RDMA READ: into the vconn's staging memory, where the agent offers it,
// and copied out from there.
func (c *Conn) ReadRegion(ctx context.Context, id uint32, off uint64, dst []byte) error {
	if staged, err := c.staged(ctx, id, off, dst, true); staged {
		if err != nil {
			return fmt.Errorf("vconn: read region %d: %w", id, err)
		}
		return nil
	}
	for done := 0; done < len(dst); {
		n := min(len(dst)-done, frame.MaxPayload)
		rep, err := c.op(ctx, &frame.Frame{Op: frame.OpRead, Arg: id, Arg2: off + uint64(done), Payload: frame.AppendLength(nil, uint32(n))})
		if err == nil {
			err = c.readReply(rep, n)
		}
		if err != nil {
			return fmt.Errorf("vconn: read region %d: %w", id, err)
		}
		done += copy(dst[done:], rep.Payload)
	}
	return nil
}

// readReply checks that a read's reply carries the n bytes asked: an
// agent that answers with fewer (none: the read would ask again forever)
// or more breaks the protocol, which ends the session as a malformed
// frame does.
func (c *Conn) readReply(rep frame.Frame, n int) error {
	if len(rep.Payload) == n {
		return nil
	}
	err := &Error{Code: CodeAgentGone, Message: fmt.Sprintf("protocol error: a read of %d bytes answered with %d", n, len(rep.Payload))}
	c.s.shutdown(err)
	return err
}

func errorsIsAgentGone(err error) bool { return errors.Is(err, ErrAgentGone) }
