package soft

import (
	"net/netip"
	"runtime"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
	"github.com/rdmavisor/rdmavisor/internal/verbs/soft/wire"
)

// rcPair is two devices on one in-memory fabric with a connected RC QP
// pair, one CQ each and a 1 MiB region each.
type rcPair struct {
	da, db   *Device
	cqa, cqb verbs.CQ
	qa, qb   verbs.QP
	mra, mrb verbs.MR
}

func newRCPair(t testing.TB, fb *wire.Fabric, mtu verbs.MTU) *rcPair {
	t.Helper()
	return newRCPairNIC(t, fb, mtu, nil)
}

// newRCPairNIC is newRCPair with devices that model the NIC m (nil: none).
func newRCPairNIC(t testing.TB, fb *wire.Fabric, mtu verbs.MTU, m *NICModel) *rcPair {
	t.Helper()
	open := func(ip string) *Device {
		w, err := fb.Attach(verbs.GIDFromAddr(netip.MustParseAddr(ip)))
		if err != nil {
			t.Fatal(err)
		}
		d, err := Open(Config{Wire: w, NIC: m})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	p := &rcPair{da: open("10.1.0.1"), db: open("10.1.0.2")}
	side := func(d *Device) (verbs.PD, verbs.CQ, verbs.QP, verbs.MR) {
		pd, err := d.AllocPD()
		if err != nil {
			t.Fatal(err)
		}
		cq, err := d.CreateCQ(4096)
		if err != nil {
			t.Fatal(err)
		}
		qp, err := pd.CreateQP(&verbs.QPInitAttr{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: verbs.QPCap{MaxSendWR: 1024, MaxRecvWR: 1024, MaxSendSGE: 1, MaxRecvSGE: 1}})
		if err != nil {
			t.Fatal(err)
		}
		mr, err := pd.RegMR(8<<20, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = qp.Close()
			_ = mr.Close()
			_ = cq.Close()
			_ = pd.Close()
			_ = d.Close()
		})
		return pd, cq, qp, mr
	}
	_, p.cqa, p.qa, p.mra = side(p.da)
	_, p.cqb, p.qb, p.mrb = side(p.db)
	connectRC(t, p.qa, p.qb.QPN(), p.db.gid, mtu)
	connectRC(t, p.qb, p.qa.QPN(), p.da.gid, mtu)
	return p
}

func connectRC(t testing.TB, q verbs.QP, dqpn uint32, dgid verbs.GID, mtu verbs.MTU) {
	t.Helper()
	connectRCRdAtomic(t, q, dqpn, dgid, mtu, 16)
}

// connectRCRdAtomic is connectRC with rdAtomic reads at a time each way
// (max_rd_atomic and max_dest_rd_atomic).
func connectRCRdAtomic(t testing.TB, q verbs.QP, dqpn uint32, dgid verbs.GID, mtu verbs.MTU, rdAtomic uint8) {
	t.Helper()
	if err := q.Modify(&verbs.QPAttr{State: verbs.QPStateInit, Port: 1, AccessFlags: verbs.AccessRemoteWrite | verbs.AccessRemoteRead},
		verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags); err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(&verbs.QPAttr{State: verbs.QPStateRTR, PathMTU: mtu, DestQPN: dqpn, RQPSN: 0, AH: verbs.AHAttr{DGID: dgid}, MaxDestRdAtomic: rdAtomic, MinRNRTimer: 1},
		verbs.QPAttrState|verbs.QPAttrAV|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer); err != nil {
		t.Fatal(err)
	}
	if err := q.Modify(&verbs.QPAttr{State: verbs.QPStateRTS, SQPSN: 0, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: rdAtomic},
		verbs.QPAttrState|verbs.QPAttrSQPSN|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|verbs.QPAttrMaxQPRdAtomic); err != nil {
		t.Fatal(err)
	}
}

func sge(mr verbs.MR, off uint64, n uint32) [verbs.MaxSGE]verbs.SGE {
	return [verbs.MaxSGE]verbs.SGE{{Addr: mr.Addr() + off, Length: n, LKey: mr.LKey()}}
}

// pollOne spins until cq yields a completion.
func pollOne(t testing.TB, cq verbs.CQ, wc []verbs.WC) {
	for i := 0; ; i++ {
		if cq.Poll(wc[:1]) == 1 {
			if wc[0].Status != verbs.WCSuccess {
				t.Fatalf("completion %+v", wc[0])
			}
			return
		}
		if i > 1<<24 {
			t.Fatal("no completion")
		}
		runtime.Gosched() // let the devices' receive loops run
	}
}
