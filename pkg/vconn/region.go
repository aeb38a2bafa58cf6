package vconn

import (
	"context"
	"errors"
	"fmt"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// Access says what the peer may do to an exported region.
type Access uint8

// Accesses (the engine's values).
const (
	AccessRead  Access = 1 << 0
	AccessWrite Access = 1 << 1
)

// Region is memory this side exported to the peer vconn. It lives in the
// agent's registered memory; ReadAt and WriteAt copy over the socket (the
// memfd fast path that maps it into the pod is future work).
type Region struct {
	c    *Conn
	id   uint32
	size int
}

// Export registers size bytes in the agent and exports them to the peer
// vconn, which may then Read or Write them as access allows. The export
// reaches the peer before any message sent after Export returns.
func (c *Conn) Export(ctx context.Context, size int, access Access) (*Region, error) {
	rep, err := c.op(ctx, &frame.Frame{Op: frame.OpExport, Arg: uint32(access), Arg2: uint64(size)})
	if err != nil {
		return nil, fmt.Errorf("vconn: export: %w", err)
	}
	return &Region{c: c, id: rep.Arg, size: size}, nil
}

// ID names the region to the peer.
func (r *Region) ID() uint32 { return r.id }

// Size is the region's length.
func (r *Region) Size() int { return r.size }

// ReadAt copies the region's bytes at off into p.
func (r *Region) ReadAt(ctx context.Context, p []byte, off int64) error {
	for done := 0; done < len(p); {
		n := min(len(p)-done, frame.MaxPayload)
		rep, err := r.c.op(ctx, &frame.Frame{Op: frame.OpLocalRead, Arg: r.id, Arg2: uint64(off) + uint64(done), Payload: frame.AppendLength(nil, uint32(n))})
		if err != nil {
			return fmt.Errorf("vconn: region %d: %w", r.id, err)
		}
		done += copy(p[done:], rep.Payload)
	}
	return nil
}

// WriteAt copies p into the region at off.
func (r *Region) WriteAt(ctx context.Context, p []byte, off int64) error {
	for done := 0; done < len(p); {
		n := min(len(p)-done, frame.MaxPayload)
		if _, err := r.c.op(ctx, &frame.Frame{Op: frame.OpLocalWrite, Arg: r.id, Arg2: uint64(off) + uint64(done), Payload: p[done : done+n]}); err != nil {
			return fmt.Errorf("vconn: region %d: %w", r.id, err)
		}
		done += n
	}
	return nil
}

// Close withdraws the export. Its memory stays registered, and counts
// against the allocation's limits (ErrLimit), until the peer confirmed it
// no longer uses the region: a round trip, or, where the confirmation
// cannot come (the vconn's sends wait for a peer that does not read),
// until the vconn ends and a grace of seconds passed.
func (r *Region) Close(ctx context.Context) error {
	if _, err := r.c.op(ctx, &frame.Frame{Op: frame.OpUnexport, Arg: r.id}); err != nil {
		return fmt.Errorf("vconn: unexport region %d: %w", r.id, err)
	}
	return nil
}

// WriteRegion writes data into the peer's region id at off with RDMA
// WRITE, returning once it is placed.
func (c *Conn) WriteRegion(ctx context.Context, id uint32, off uint64, data []byte) error {
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
// RDMA READ.
func (c *Conn) ReadRegion(ctx context.Context, id uint32, off uint64, dst []byte) error {
	for done := 0; done < len(dst); {
		n := min(len(dst)-done, frame.MaxPayload)
		rep, err := c.op(ctx, &frame.Frame{Op: frame.OpRead, Arg: id, Arg2: off + uint64(done), Payload: frame.AppendLength(nil, uint32(n))})
		if err != nil {
			return fmt.Errorf("vconn: read region %d: %w", id, err)
		}
		done += copy(dst[done:], rep.Payload)
	}
	return nil
}

func errorsIsAgentGone(err error) bool { return errors.Is(err, ErrAgentGone) }
