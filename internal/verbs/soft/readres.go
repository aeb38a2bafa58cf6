package soft

// readRes is a READ the responder executed, kept so that it can answer it
// again: rxe's responder resource (struct resp_res), one per
// max_dest_rd_atomic, reused round robin.
type readRes struct {
	first, last uint32 // PSNs of its responses
	rkey        uint32
	va          uint64
	n           uint32
	used        bool
}

// readResources are the responder's READs to answer again. A duplicate
// READ (IBA 9.9.2.1: its response may have been lost) is executed only
// when it falls within one of them, as rxe's duplicate_request does: the
// same key, a PSN in its range, and its bytes a part of its bytes. Any
// other duplicate READ is dropped (class D). Before, a READ behind the
// expected PSN with a valid key was executed whatever it asked: a forged
// 32-byte request from a host that spoofed the peer had the node send its
// peer the whole window.
type readResources struct {
	res  []readRes
	next int
}

// reset sizes the resources as rxe does: max_dest_rd_atomic rounded up to
// a power of two; none when it is zero.
func (r *readResources) reset(maxDestRdAtomic uint8) {
	n := 0
	if maxDestRdAtomic > 0 {
		n = 1
		for n < int(maxDestRdAtomic) {
			n <<= 1
		}
	}
	if cap(r.res) >= n {
		r.res = r.res[:n]
		clear(r.res)
	} else {
		r.res = make([]readRes, n)
	}
	r.next = 0
}

// record keeps a READ executed at psn whose responses take npkts PSNs,
// over the oldest one kept.
func (r *readResources) record(psn, npkts, rkey uint32, va uint64, n uint32) {
	if len(r.res) == 0 {
		return
	}
	r.res[r.next] = readRes{first: psn, last: psnAdd(psn, npkts-1), rkey: rkey, va: va, n: n, used: true}
	r.next = (r.next + 1) % len(r.res)
}

// replay reports whether a duplicate READ of n bytes at va with rkey, at
// psn, asks again (all or a part) for one kept.
func (r *readResources) replay(psn, rkey uint32, va uint64, n uint32) bool {
	for i := range r.res {
		res := &r.res[i]
		if !res.used || psnDiff(psn, res.first) < 0 || psnDiff(psn, res.last) > 0 {
			continue
		}
		// rxe takes the first resource whose range holds the PSN.
		return rkey == res.rkey && va >= res.va && n <= res.n && va-res.va <= uint64(res.n-n)
	}
	return false
}
