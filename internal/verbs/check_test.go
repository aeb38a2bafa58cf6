package verbs

import (
	"errors"
	"strings"
	"testing"
)

// stubCQ is a CQ for CheckQPInitAttr, which only asks whether one is given.
type stubCQ struct{ CQ }

func TestCheckQPInitAttr(t *testing.T) {
	ok := func(mod func(*QPInitAttr)) *QPInitAttr {
		a := &QPInitAttr{Type: QPTypeRC, SendCQ: stubCQ{}, RecvCQ: stubCQ{}}
		if mod != nil {
			mod(a)
		}
		return a
	}
	cases := []struct {
		name string
		attr *QPInitAttr
		why  string // "" when accepted
	}{
		{"RC", ok(nil), ""},
		{"UC", ok(func(a *QPInitAttr) { a.Type = QPTypeUC }), ""},
		{"UD", ok(func(a *QPInitAttr) { a.Type = QPTypeUD }), ""},
		{"nil", nil, "no attributes"},
		{"type 9", ok(func(a *QPInitAttr) { a.Type = 9 }), "type 9 is not RC, UC or UD"},
		{"type 0", ok(func(a *QPInitAttr) { a.Type = 0 }), "type 0"},
		{"no send CQ", ok(func(a *QPInitAttr) { a.SendCQ = nil }), "no send CQ"},
		{"no receive CQ", ok(func(a *QPInitAttr) { a.RecvCQ = nil }), "no receive CQ"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			expectVerdict(t, CheckQPInitAttr(c.attr), c.why)
		})
	}
}

// expectVerdict fails unless err is nil when why is empty, or else an
// ErrInvalid whose message says why.
func expectVerdict(t *testing.T, err error, why string) {
	t.Helper()
	switch {
	case why == "" && err != nil:
		t.Fatalf("refused: %v", err)
	case why == "":
	case err == nil:
		t.Fatalf("accepted, want refused: %s", why)
	case !errors.Is(err, ErrInvalid):
		t.Fatalf("error %v does not match ErrInvalid", err)
	case !strings.Contains(err.Error(), why):
		t.Fatalf("error %q does not say %q", err, why)
	}
}

func TestCheckQPAttr(t *testing.T) {
	all := QPAttrMask(1<<21 - 1) // every field named
	good := QPAttr{State: QPStateRTS, CurState: QPStateRTR, PathMTU: MTU4096, RetryCnt: 7, RNRRetry: 7,
		Timeout: 31, MinRNRTimer: 31, RQPSN: 0xFFFFFF, SQPSN: 0xFFFFFF, DestQPN: 0xFFFFFF}
	cases := []struct {
		name  string
		field QPAttrMask
		mod   func(*QPAttr)
		why   string
	}{
		{"state", QPAttrState, func(a *QPAttr) { a.State = QPStateErr + 1 }, "state 7 out of range 0..6"},
		{"current state", QPAttrCurState, func(a *QPAttr) { a.CurState = 200 }, "current state 200"},
		{"path MTU 0", QPAttrPathMTU, func(a *QPAttr) { a.PathMTU = 0 }, "path MTU enum 0"},
		{"path MTU 6", QPAttrPathMTU, func(a *QPAttr) { a.PathMTU = MTU4096 + 1 }, "path MTU enum 6"},
		{"retry count", QPAttrRetryCnt, func(a *QPAttr) { a.RetryCnt = 8 }, "retry count 8 out of range 0..7"},
		{"RNR retry", QPAttrRNRRetry, func(a *QPAttr) { a.RNRRetry = 8 }, "RNR retry 8"},
		{"timeout", QPAttrTimeout, func(a *QPAttr) { a.Timeout = 32 }, "timeout 32 out of range 0..31"},
		{"min RNR timer", QPAttrMinRNRTimer, func(a *QPAttr) { a.MinRNRTimer = 32 }, "min RNR timer 32"},
		{"RQ PSN", QPAttrRQPSN, func(a *QPAttr) { a.RQPSN = 1 << 24 }, "RQ PSN 16777216 out of range 0..16777215"},
		{"SQ PSN", QPAttrSQPSN, func(a *QPAttr) { a.SQPSN = 1 << 24 }, "SQ PSN"},
		{"destination QPN", QPAttrDestQPN, func(a *QPAttr) { a.DestQPN = 1 << 24 }, "destination QPN"},
	}
	t.Run("widest values", func(t *testing.T) {
		a := good
		expectVerdict(t, CheckQPAttr(&a, all), "")
	})
	t.Run("nil", func(t *testing.T) { expectVerdict(t, CheckQPAttr(nil, all), "no attributes") })
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := good
			c.mod(&a)
			expectVerdict(t, CheckQPAttr(&a, c.field), c.why)
			expectVerdict(t, CheckQPAttr(&a, all), c.why)
			// A field the mask does not name is not read.
			expectVerdict(t, CheckQPAttr(&a, all&^c.field), "")
		})
	}
}

func TestCheckSendWR(t *testing.T) {
	rc := SendLimits{Type: QPTypeRC, MaxSGE: 2, MaxInline: 64, MTU: 1024}
	uc, ud := rc, rc
	uc.Type, ud.Type = QPTypeUC, QPTypeUD
	wr := func(op WROpcode, lens ...uint32) SendWR {
		w := SendWR{Opcode: op, NumSGE: uint8(len(lens))}
		for i, n := range lens {
			w.SG[i].Length = n
		}
		return w
	}
	with := func(w SendWR, mod func(*SendWR)) SendWR { mod(&w); return w }
	inline := func(w *SendWR) { w.Flags |= SendInline }
	bind := with(wr(WRBindMW, 4096), func(w *SendWR) { w.MWAccess = AccessRemoteRead | AccessRemoteWrite | AccessZeroBased })
	cases := []struct {
		name string
		lim  SendLimits
		wr   SendWR
		why  string
	}{
		{"send", rc, wr(WRSend, 100, 200), ""},
		{"send, no SGE", ud, wr(WRSendWithImm), ""},
		{"SGEs past the QP's", rc, wr(WRSend, 1, 1, 1), "3 SGEs, the QP takes 2"},
		{"SGEs past MaxSGE", SendLimits{Type: QPTypeRC, MaxSGE: 255}, with(wr(WRSend), func(w *SendWR) { w.NumSGE = MaxSGE + 1 }), "5 SGEs"},
		{"write on RC", rc, wr(WRRDMAWrite, 1<<20), ""},
		{"write on UC", uc, wr(WRRDMAWriteWithImm, 10), ""},
		{"write on UD", ud, wr(WRRDMAWrite, 10), "RDMA_WRITE on a UD QP"},
		{"read on RC", rc, wr(WRRDMARead, 1<<20), ""},
		{"read on UC", uc, wr(WRRDMARead, 10), "on a UC QP"},
		{"read on UD", ud, wr(WRRDMARead, 10), "on a UD QP"},
		{"inline read", rc, with(wr(WRRDMARead, 10), inline), "inline RDMA_READ"},
		{"atomic", rc, wr(5, 8), "opcode"},
		{"opcode 42", rc, wr(42, 8), "opcode"},
		{"inline send within MaxInline", rc, with(wr(WRSend, 32, 32), inline), ""},
		{"inline send past MaxInline", rc, with(wr(WRSend, 32, 33), inline), "65 bytes of inline data, the QP takes 64"},
		{"long send, not inline", rc, wr(WRSend, 1<<31), ""},
		{"UD send of the MTU", ud, wr(WRSend, 1000, 24), ""},
		{"UD send past the MTU", ud, wr(WRSend, 1000, 25), "UD message of 1025 bytes exceeds the 1024-byte MTU"},
		{"RC send past the MTU", rc, wr(WRSend, 1000, 25), ""},
		{"bind", rc, bind, ""},
		{"bind on UC", uc, bind, ""},
		{"bind on UD", ud, bind, "BIND_MW on a UD QP"},
		{"inline bind", rc, with(bind, inline), "inline BIND_MW"},
		{"bind of two SGEs", rc, with(bind, func(w *SendWR) { w.NumSGE = 2 }), "a bind takes one SGE, not 2"},
		{"bind of no SGE", rc, with(bind, func(w *SendWR) { w.NumSGE = 0 }), "a bind takes one SGE, not 0"},
		{"bind granting local write", rc, with(bind, func(w *SendWR) { w.MWAccess |= AccessLocalWrite }), "window access 0x27"},
		{"bind past the MTU and MaxInline", ud, with(bind, func(w *SendWR) { w.SG[0].Length = 1 << 30 }), "on a UD QP"},
		{"bind longer than the MTU", rc, with(bind, func(w *SendWR) { w.SG[0].Length = 1 << 30 }), ""},
		{"invalidate", uc, wr(WRLocalInv), ""},
		{"invalidate on UD", ud, wr(WRLocalInv), "LOCAL_INV on a UD QP"},
		{"inline invalidate", rc, with(wr(WRLocalInv), inline), "inline LOCAL_INV"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			expectVerdict(t, CheckSendWR(&c.wr, &c.lim), c.why)
		})
	}
}

// TestCheckSendWRAllocatesNothing: PostSend checks every WR it posts.
func TestCheckSendWRAllocatesNothing(t *testing.T) {
	lim := SendLimits{Type: QPTypeUD, MaxSGE: 4, MaxInline: 64, MTU: 4096}
	wr := SendWR{Opcode: WRSendWithImm, NumSGE: 2, Flags: SendInline | SendSignaled}
	wr.SG[0].Length, wr.SG[1].Length = 16, 16
	if n := testing.AllocsPerRun(100, func() {
		if err := CheckSendWR(&wr, &lim); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("CheckSendWR allocated %v times per call, want 0", n)
	}
}

// FuzzCheckSendWR: a WR the check accepts is one the QP can carry, and a
// refusal is an ErrInvalid.
func FuzzCheckSendWR(f *testing.F) {
	f.Add(uint8(QPTypeRC), uint8(2), uint32(64), uint32(1024), uint8(WRSend), uint8(2), uint32(0), uint32(100), uint32(200), uint32(0))
	f.Add(uint8(QPTypeUD), uint8(1), uint32(0), uint32(4096), uint8(WRSendWithImm), uint8(1), uint32(SendInline), uint32(4097), uint32(0), uint32(0))
	f.Add(uint8(QPTypeUC), uint8(4), uint32(16), uint32(256), uint8(WRRDMARead), uint8(1), uint32(0), uint32(8), uint32(0), uint32(0))
	f.Add(uint8(QPTypeRC), uint8(1), uint32(0), uint32(256), uint8(WRBindMW), uint8(1), uint32(0), uint32(4096), uint32(0), uint32(AccessRemoteWrite|AccessZeroBased))
	f.Add(uint8(QPTypeUD), uint8(1), uint32(0), uint32(256), uint8(WRLocalInv), uint8(0), uint32(SendInline), uint32(0), uint32(0), uint32(0))
	f.Fuzz(func(t *testing.T, typ, maxSGE uint8, maxInline, mtu uint32, op, numSGE uint8, flags, len0, len1, access uint32) {
		lim := SendLimits{Type: QPType(typ), MaxSGE: uint32(maxSGE), MaxInline: maxInline, MTU: mtu}
		wr := SendWR{Opcode: WROpcode(op), NumSGE: numSGE, Flags: SendFlags(flags), MWAccess: Access(access)}
		wr.SG[0].Length, wr.SG[1].Length, wr.SG[3].Length = len0, len1, len0^len1
		err := CheckSendWR(&wr, &lim)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refusal %v does not match ErrInvalid", err)
			}
			return
		}
		if wr.NumSGE > MaxSGE || uint32(wr.NumSGE) > lim.MaxSGE {
			t.Fatalf("accepted %d SGEs, the QP takes %d", wr.NumSGE, lim.MaxSGE)
		}
		inl := wr.Flags&SendInline != 0
		switch wr.Opcode {
		case WRSend, WRSendWithImm:
		case WRRDMAWrite, WRRDMAWriteWithImm:
			if lim.Type == QPTypeUD {
				t.Fatal("accepted an RDMA write on UD")
			}
		case WRRDMARead:
			if lim.Type != QPTypeRC || inl {
				t.Fatalf("accepted a read on %v (inline %v)", lim.Type, inl)
			}
		case WRBindMW, WRLocalInv:
			if lim.Type == QPTypeUD || inl {
				t.Fatalf("accepted %v on %v (inline %v)", wr.Opcode, lim.Type, inl)
			}
			if wr.Opcode == WRBindMW && (wr.NumSGE != 1 || wr.MWAccess&^mwAccess != 0) {
				t.Fatalf("accepted a bind of %d SGEs granting %#x", wr.NumSGE, uint32(wr.MWAccess))
			}
			return
		default:
			t.Fatalf("accepted opcode %v", wr.Opcode)
		}
		if inl && wr.Len() > uint64(lim.MaxInline) {
			t.Fatalf("accepted %d inline bytes, the QP takes %d", wr.Len(), lim.MaxInline)
		}
		if lim.Type == QPTypeUD && wr.Len() > uint64(lim.MTU) {
			t.Fatalf("accepted a UD message of %d bytes, MTU %d", wr.Len(), lim.MTU)
		}
	})
}

// FuzzCheckQPAttr: every field an accepted Modify names fits its IB field,
// so no provider truncates it; a refusal is an ErrInvalid.
func FuzzCheckQPAttr(f *testing.F) {
	f.Add(uint32(1<<21-1), uint8(QPStateRTS), uint8(QPStateRTR), uint8(MTU1024), uint8(7), uint8(7), uint8(14), uint8(12), uint32(0xFFFFFF), uint32(0), uint32(0x11))
	f.Add(uint32(QPAttrRetryCnt), uint8(0), uint8(0), uint8(0), uint8(8), uint8(0), uint8(0), uint8(0), uint32(0), uint32(0), uint32(0))
	f.Add(uint32(QPAttrPathMTU|QPAttrDestQPN), uint8(0), uint8(0), uint8(6), uint8(0), uint8(0), uint8(0), uint8(0), uint32(0), uint32(0), uint32(1<<24))
	f.Fuzz(func(t *testing.T, mask uint32, state, cur, mtu, retry, rnr, timeout, minRNR uint8, rqPSN, sqPSN, dqpn uint32) {
		a := QPAttr{State: QPState(state), CurState: QPState(cur), PathMTU: MTU(mtu), RetryCnt: retry, RNRRetry: rnr,
			Timeout: timeout, MinRNRTimer: minRNR, RQPSN: rqPSN, SQPSN: sqPSN, DestQPN: dqpn}
		m := QPAttrMask(mask)
		err := CheckQPAttr(&a, m)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("refusal %v does not match ErrInvalid", err)
			}
			return
		}
		fits := func(bit QPAttrMask, v, bits uint32) {
			if m&bit != 0 && v>>bits != 0 {
				t.Fatalf("accepted field %#x = %d, wider than %d bits", uint32(bit), v, bits)
			}
		}
		fits(QPAttrRetryCnt, uint32(retry), 3)
		fits(QPAttrRNRRetry, uint32(rnr), 3)
		fits(QPAttrTimeout, uint32(timeout), 5)
		fits(QPAttrMinRNRTimer, uint32(minRNR), 5)
		fits(QPAttrRQPSN, rqPSN, 24)
		fits(QPAttrSQPSN, sqPSN, 24)
		fits(QPAttrDestQPN, dqpn, 24)
		if m&QPAttrPathMTU != 0 && a.PathMTU.Bytes() == 0 {
			t.Fatalf("accepted path MTU enum %d", mtu)
		}
		if m&QPAttrState != 0 && a.State > QPStateErr || m&QPAttrCurState != 0 && a.CurState > QPStateErr {
			t.Fatalf("accepted states %d, %d", state, cur)
		}
	})
}
