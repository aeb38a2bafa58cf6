//go:build ibverbs && linux

package ibv

// #include "shim.h"
import "C"

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

type cq struct {
	life
	dev *device
	cq  *C.struct_ibv_cq
	ch  *C.struct_ibv_comp_channel
	fd  int
}

var _ verbs.CQ = (*cq)(nil)

// CreateCQ creates a CQ with its own completion channel, whose descriptor
// is non-blocking so AckEvents never waits.
func (d *device) CreateCQ(cqe int) (verbs.CQ, error) {
	what := fmt.Sprintf("create CQ of %d entries on %s", cqe, d.name)
	if cqe <= 0 || (d.attr.MaxCQE > 0 && cqe > d.attr.MaxCQE) {
		return nil, fmt.Errorf("ibv: %s: %w: want 1..%d entries", what, verbs.ErrInvalid, d.attr.MaxCQE)
	}
	if err := d.hold(what); err != nil {
		return nil, err
	}
	ch, cerr := C.ibv_create_comp_channel(d.ctx)
	if ch == nil {
		d.release()
		return nil, wrap(what+": completion channel", errnoOf(0, cerr), false)
	}
	fd := int(ch.fd)
	if err := unix.SetNonblock(fd, true); err != nil {
		C.ibv_destroy_comp_channel(ch)
		d.release()
		return nil, fmt.Errorf("ibv: %s: %w", what, err)
	}
	c, cerr := C.ibv_create_cq(d.ctx, C.int(cqe), nil, ch, 0)
	if c == nil {
		C.ibv_destroy_comp_channel(ch)
		d.release()
		return nil, wrap(what, errnoOf(0, cerr), false)
	}
	return &cq{dev: d, cq: c, ch: ch, fd: fd}, nil
}

// Poll crosses cgo once per call and allocates nothing: the ibv_wc batch
// lives on the C stack and is converted into wcs there.
func (c *cq) Poll(wcs []verbs.WC) int {
	if len(wcs) == 0 || c.dead.Load() {
		return 0
	}
	n := C.rv_poll(c.cq, (*C.struct_rv_wc)(unsafe.Pointer(&wcs[0])), C.int(len(wcs)))
	if n < 0 {
		return 0
	}
	return int(n)
}

func (c *cq) ReqNotify(solicitedOnly bool) error {
	if err := c.closed("CQ ReqNotify"); err != nil {
		return err
	}
	so := C.int(0)
	if solicitedOnly {
		so = 1
	}
	if rc := C.ibv_req_notify_cq(c.cq, so); rc != 0 {
		return wrap("CQ ReqNotify", errnoOf(int(rc), nil), false)
	}
	return nil
}

func (c *cq) FD() int { return c.fd }

func (c *cq) AckEvents() (int, error) {
	if err := c.closed("CQ AckEvents"); err != nil {
		return 0, err
	}
	return int(C.rv_ack_events(c.ch, c.cq)), nil
}

func (c *cq) Close() error {
	return c.life.close("CQ", func() error {
		C.rv_ack_events(c.ch, c.cq) // ibv_destroy_cq waits for unacked events
		if rc := C.ibv_destroy_cq(c.cq); rc != 0 {
			return wrap("destroy CQ", errnoOf(int(rc), nil), false)
		}
		if rc := C.ibv_destroy_comp_channel(c.ch); rc != 0 {
			return wrap("destroy completion channel", errnoOf(int(rc), nil), false)
		}
		c.dev.release()
		return nil
	})
}
