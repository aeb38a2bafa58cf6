package agent

import (
	"bytes"
	"errors"
	"net"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/rdmavisor/rdmavisor/internal/agent/controlpb"
	"github.com/rdmavisor/rdmavisor/internal/pki"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// The client side's checks of a peer agent's replies (Identity, ConnectQP,
// beats), fed arbitrary protobuf: each either refuses the reply with
// errBadReply or returns exactly what the reply says, and which it does is
// decided here from the reply alone, independently of the code under test.

func marshal(f *testing.F, m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	return b
}

// FuzzIdentityReply: identityOf, for the remote of node-b, under node-b's
// certificate (127.0.0.3 and fd00::3), under node-x's, and without TLS.
func FuzzIdentityReply(f *testing.F) {
	v4, v6 := net.ParseIP("127.0.0.3"), net.ParseIP("fd00::3")
	for _, n := range []*controlpb.Node{
		{Name: "node-b", ControlAddress: "127.0.0.3:1", Gid: v4.To16(), Incarnation: 7},
		{Name: "node-b", Gid: v6},
		{Name: "node-b", Gid: make([]byte, 16)},
		{Name: "node-b", Gid: v4.To4()},
		{Name: "node-a", Gid: v4.To16()},
		{Name: "node-b", Gid: net.ParseIP("127.0.0.2").To16()},
		{Gid: v4.To16()},
		nil,
	} {
		f.Add(marshal(f, &controlpb.IdentityReply{Node: n, Qkey: 1, Mtu: 1024}))
	}
	f.Add(marshal(f, &controlpb.IdentityReply{Node: &controlpb.Node{Name: "node-b", Gid: v4.To16()}, RailGids: [][]byte{v6, v4.To4()}}))
	f.Add([]byte{})
	f.Add(marshal(f, &controlpb.IdentityReply{Node: &controlpb.Node{Name: "node-b", Gid: v4.To16()}, RailGids: [][]byte{net.ParseIP("10.1.0.2"), v6}}))
	certs := []*pki.Identity{{Node: "node-b", IPs: []net.IP{v4, v6}}, {Node: "node-x", IPs: []net.IP{v4, v6}}, nil}
	// node-b's RDMANode lists 10.1.0.2 as its rail 1, which its
	// certificate does not name.
	rail1 := net.ParseIP("10.1.0.2")
	listed := func(node string, rail int, gid verbs.GID) bool {
		return node == "node-b" && rail == 1 && net.IP(gid[:]).Equal(rail1)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var rep controlpb.IdentityReply
		if proto.Unmarshal(in, &rep) != nil {
			return
		}
		for k := range 3 * len(certs) {
			id, rail := certs[k%len(certs)], k/len(certs)
			// Rail 0's GID is the node's, rail i's the i-th of RailGids.
			var g []byte
			if rail == 0 {
				g = rep.GetNode().GetGid()
			} else if rail <= len(rep.GetRailGids()) {
				g = rep.GetRailGids()[rail-1]
			}
			gid, err := identityOf(&rep, "node-b", id, rail, listed)
			want := rep.GetNode().GetName() == "node-b" && len(g) == 16 && !bytes.Equal(g, make([]byte, 16)) &&
				(id == nil || id.Node == "node-b" && (net.IP(g).Equal(v4) || net.IP(g).Equal(v6) || rail == 1 && net.IP(g).Equal(rail1)))
			switch {
			case want && err != nil:
				t.Fatalf("cert %+v: reply %v refused: %v", id, &rep, err)
			case !want && err == nil:
				t.Fatalf("cert %+v: reply %v accepted as GID %v", id, &rep, gid)
			case err != nil && !errors.Is(err, errBadReply):
				t.Fatalf("cert %+v: reply %v: %v, not errBadReply", id, &rep, err)
			case err == nil && !bytes.Equal(gid[:], g):
				t.Fatalf("cert %+v: reply %v gave GID %v", id, &rep, gid)
			}
		}
	})
}

// FuzzQPReply: qpReplyOf, the check of ConnectQP's answer.
func FuzzQPReply(f *testing.F) {
	for _, r := range []*controlpb.QPReply{
		{Qpn: 0x11, Psn: 5, UdQpns: []uint32{0x12, 0x13}, Epoch: 1, Secret: 7, UdSecret: 8},
		{Qpn: 1<<24 - 1, Psn: 1<<24 - 1, Epoch: 1 << 40, Secret: ^uint64(0), UdSecret: 1},
		{Qpn: 0, Psn: 1, Epoch: 1, Secret: 7, UdSecret: 8},
		{Qpn: 1 << 24, Epoch: 1, Secret: 7, UdSecret: 8},
		{Qpn: 2, Psn: 1 << 24, Epoch: 1, Secret: 7, UdSecret: 8},
		{Qpn: 2, Epoch: 0, Secret: 7, UdSecret: 8},
		{Qpn: 2, Epoch: 1, UdQpns: []uint32{0}, Secret: 7, UdSecret: 8},
		{Qpn: 2, Epoch: 1, UdQpns: make([]uint32, 65), Secret: 7, UdSecret: 8},
		{Qpn: 2, Epoch: 1, UdSecret: 8},
		{Qpn: 2, Epoch: 1, Secret: 7},
	} {
		f.Add(marshal(f, r))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var rep controlpb.QPReply
		if proto.Unmarshal(in, &rep) != nil {
			return
		}
		qp, err := qpReplyOf(&rep)
		in24 := func(v uint32) bool { return v < 1<<24 }
		want := rep.Qpn != 0 && in24(rep.Qpn) && in24(rep.Psn) && rep.Epoch != 0 && len(rep.UdQpns) <= maxUDQPNs &&
			rep.Secret != 0 && rep.UdSecret != 0 &&
			!slices.ContainsFunc(rep.UdQpns, func(q uint32) bool { return q == 0 || !in24(q) })
		switch {
		case want && err != nil:
			t.Fatalf("reply %v refused: %v", &rep, err)
		case !want && err == nil:
			t.Fatalf("reply %v accepted: %+v", &rep, qp)
		case err != nil && !errors.Is(err, errBadReply):
			t.Fatalf("reply %v: %v, not errBadReply", &rep, err)
		case err == nil && (qp.QPN != rep.Qpn || qp.PSN != rep.Psn || qp.Epoch != rep.Epoch || !slices.Equal(qp.UDQPNs, rep.UdQpns) ||
			qp.Secret != rep.Secret || qp.UDSecret != rep.UdSecret):
			t.Fatalf("reply %v gave %+v", &rep, qp)
		}
	})
}

// FuzzBeat: beatOf, the check of a beat the peer answered, after sent
// beats.
func FuzzBeat(f *testing.F) {
	for _, s := range []struct {
		b    *controlpb.Beat
		sent uint64
	}{
		{&controlpb.Beat{Seq: 1, Incarnation: 9, PeerEpoch: 2}, 1},
		{&controlpb.Beat{Seq: 3, Incarnation: 9, Gid: make([]byte, 16)}, 5},
		{&controlpb.Beat{Seq: 6, Incarnation: 9}, 5},
		{&controlpb.Beat{Seq: 0, Incarnation: 9}, 5},
		{&controlpb.Beat{Seq: 1}, 1},
		{&controlpb.Beat{Seq: 1, Incarnation: 1}, 0},
	} {
		f.Add(marshal(f, s.b), s.sent)
	}
	f.Fuzz(func(t *testing.T, in []byte, sent uint64) {
		var b controlpb.Beat
		if proto.Unmarshal(in, &b) != nil {
			return
		}
		err := beatOf(&b, sent)
		want := b.Seq >= 1 && b.Seq <= sent && b.Incarnation != 0
		switch {
		case want && err != nil:
			t.Fatalf("beat %v after %d sent refused: %v", &b, sent, err)
		case !want && err == nil:
			t.Fatalf("beat %v after %d sent accepted", &b, sent)
		case err != nil && !errors.Is(err, errBadReply):
			t.Fatalf("beat %v: %v, not errBadReply", &b, err)
		}
	})
}
