package main

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func service(ns, name string, clusterIPs ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if len(clusterIPs) > 0 {
		s.Spec.ClusterIP, s.Spec.ClusterIPs = clusterIPs[0], clusterIPs
	}
	return s
}

type ep struct {
	ip    string
	ready *bool
}

func slice(ns, svc, name string, eps ...ep) *discoveryv1.EndpointSlice {
	es := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
		Labels: map[string]string{discoveryv1.LabelServiceName: svc}}}
	for _, e := range eps {
		es.Endpoints = append(es.Endpoints, discoveryv1.Endpoint{Addresses: []string{e.ip}, Conditions: discoveryv1.EndpointConditions{Ready: e.ready}})
	}
	return es
}

func ptr[T any](v T) *T { return &v }

// testZone: a ClusterIP Service, a dual-stack one, a headless one with
// two slices (one ready pod, one not, one with no condition, one on IPv6),
// a headless one with no pods, one publishing not-ready pods, an
// ExternalName one, and a slice of a Service that does not exist.
func testZone() *Zone {
	notReadyToo := service("default", "peers", "None")
	notReadyToo.Spec.PublishNotReadyAddresses = true
	ext := service("default", "ext")
	ext.Spec.Type, ext.Spec.ExternalName = corev1.ServiceTypeExternalName, "example.com"
	return BuildZone("cluster.local", []*corev1.Service{
		service("kube-system", "kube-dns", "10.96.0.10"),
		service("default", "dual", "10.96.0.20", "fd00::20"),
		service("default", "echo", "None"),
		service("default", "empty", "None"),
		notReadyToo,
		ext,
	}, []*discoveryv1.EndpointSlice{
		slice("default", "echo", "echo-a", ep{"10.244.1.4", ptr(true)}, ep{"10.244.2.4", ptr(false)}),
		slice("default", "echo", "echo-b", ep{"10.244.0.4", nil}, ep{"fd00::4", ptr(true)}, ep{"10.244.1.4", ptr(true)}),
		slice("default", "peers", "peers-a", ep{"10.244.2.9", ptr(false)}),
		slice("other", "echo", "echo-c", ep{"10.244.3.3", ptr(true)}),
		slice("default", "gone", "gone-a", ep{"10.244.3.4", ptr(true)}),
	})
}

func query(t testing.TB, name string, typ dnsmessage.Type, edns int) []byte {
	t.Helper()
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 4242, RecursionDesired: true})
	_ = b.StartQuestions()
	if err := b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET}); err != nil {
		t.Fatal(err)
	}
	if edns > 0 {
		_ = b.StartAdditionals()
		var rh dnsmessage.ResourceHeader
		if err := rh.SetEDNS0(edns, dnsmessage.RCodeSuccess, false); err != nil {
			t.Fatal(err)
		}
		if err := b.OPTResource(rh, dnsmessage.OPTResource{}); err != nil {
			t.Fatal(err)
		}
	}
	m, err := b.Finish()
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type reply struct {
	rcode     dnsmessage.RCode
	auth, tc  bool
	ips       []netip.Addr
	opt       bool
	questions int
}

func parse(t *testing.T, m []byte) reply {
	t.Helper()
	var msg dnsmessage.Message
	if err := msg.Unpack(m); err != nil {
		t.Fatalf("unpacking the response: %v", err)
	}
	if msg.ID != 4242 || !msg.Response {
		t.Fatalf("response header %+v: want ID 4242, a response", msg.Header)
	}
	r := reply{rcode: msg.RCode, auth: msg.Authoritative, tc: msg.Truncated, questions: len(msg.Questions)}
	for _, a := range msg.Answers {
		switch b := a.Body.(type) {
		case *dnsmessage.AResource:
			r.ips = append(r.ips, netip.AddrFrom4(b.A))
		case *dnsmessage.AAAAResource:
			r.ips = append(r.ips, netip.AddrFrom16(b.AAAA))
		}
		if a.Header.TTL != ttl {
			t.Errorf("TTL %d, want %d", a.Header.TTL, ttl)
		}
	}
	for _, a := range msg.Additionals {
		r.opt = r.opt || a.Header.Type == dnsmessage.TypeOPT
	}
	return r
}

func addrs(s ...string) []netip.Addr {
	var out []netip.Addr
	for _, a := range s {
		out = append(out, netip.MustParseAddr(a))
	}
	return out
}

func TestAnswer(t *testing.T) {
	z := testZone()
	for _, tc := range []struct {
		name  string
		qname string
		typ   dnsmessage.Type
		rcode dnsmessage.RCode
		ips   []string // in any order
		auth  bool
	}{
		{"clusterIP", "kube-dns.kube-system.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.0.10"}, true},
		{"clusterIP has no AAAA: NODATA", "kube-dns.kube-system.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, nil, true},
		{"dual-stack A", "dual.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.96.0.20"}, true},
		{"dual-stack AAAA", "dual.default.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, []string{"fd00::20"}, true},
		{"headless: ready pods of both slices, once each", "echo.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.244.1.4", "10.244.0.4"}, true},
		{"headless AAAA", "echo.default.svc.cluster.local.", dnsmessage.TypeAAAA, dnsmessage.RCodeSuccess, []string{"fd00::4"}, true},
		{"case-insensitive", "ECHO.Default.SVC.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.244.1.4", "10.244.0.4"}, true},
		{"other namespace's Service of the same name", "echo.other.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil, true},
		{"headless without pods: NODATA", "empty.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, nil, true},
		{"publishNotReadyAddresses", "peers.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.244.2.9"}, true},
		{"ExternalName is not served", "ext.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil, true},
		{"slice without Service", "gone.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil, true},
		{"other types: NODATA", "echo.default.svc.cluster.local.", dnsmessage.TypeSRV, dnsmessage.RCodeSuccess, nil, true},
		{"name above a Service exists", "default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, nil, true},
		// The kubelet's search path (ndots:5) in namespace default: a
		// client's "echo.default.svc" is tried with each suffix in turn;
		// the first two must be NXDOMAIN for the third to be asked.
		{"search: NS.svc.cluster.local", "echo.default.svc.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil, true},
		{"search: svc.cluster.local", "echo.default.svc.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil, true},
		{"search: cluster.local", "echo.default.svc.cluster.local.", dnsmessage.TypeA, dnsmessage.RCodeSuccess, []string{"10.244.1.4", "10.244.0.4"}, true},
		{"outside the zone: NXDOMAIN, not forwarded", "example.com.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil, false},
		{"the bare name, as tried last", "echo.default.svc.", dnsmessage.TypeA, dnsmessage.RCodeNameError, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := z.Answer(query(t, tc.qname, tc.typ, 0), true)
			if err != nil {
				t.Fatal(err)
			}
			r := parse(t, m)
			if r.rcode != tc.rcode || r.auth != tc.auth || r.tc || r.questions != 1 || r.opt {
				t.Errorf("rcode %v auth %v tc %v questions %d opt %v; want rcode %v auth %v, no tc, 1 question, no OPT",
					r.rcode, r.auth, r.tc, r.questions, r.opt, tc.rcode, tc.auth)
			}
			want := addrs(tc.ips...)
			slices.SortFunc(want, netip.Addr.Compare)
			slices.SortFunc(r.ips, netip.Addr.Compare)
			if !slices.Equal(r.ips, want) {
				t.Errorf("answers %v, want %v", r.ips, want)
			}
		})
	}
}

// TestAnswerSize: a Service with more pods than 512 bytes of UDP carry is
// truncated for a plain UDP client, which then asks over TCP, where it
// gets them all; an EDNS0 client's larger size is honoured, and it gets
// an OPT back.
func TestAnswerSize(t *testing.T) {
	var eps []ep
	for i := range 60 {
		eps = append(eps, ep{ip: netip.AddrFrom4([4]byte{10, 244, 1, byte(i)}).String()})
	}
	z := BuildZone("cluster.local", []*corev1.Service{service("default", "big", "None")},
		[]*discoveryv1.EndpointSlice{slice("default", "big", "big-a", eps...)})
	const name = "big.default.svc.cluster.local."
	for _, tc := range []struct {
		name     string
		udp      bool
		edns     int
		tc, opt  bool
		nanswers int
	}{
		{"udp, 512 bytes", true, 0, true, false, 0},
		{"udp, edns 4096", true, 4096, false, true, 60},
		{"udp, edns 1232", true, 1232, false, true, 60},
		{"udp, edns 600", true, 600, true, true, 0},
		{"tcp", false, 0, false, false, 60},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := z.Answer(query(t, name, dnsmessage.TypeA, tc.edns), tc.udp)
			if err != nil {
				t.Fatal(err)
			}
			r := parse(t, m)
			if r.tc != tc.tc || r.opt != tc.opt || len(r.ips) != tc.nanswers || r.rcode != dnsmessage.RCodeSuccess {
				t.Errorf("tc %v opt %v %d answers rcode %v; want tc %v opt %v %d answers", r.tc, r.opt, len(r.ips), r.rcode, tc.tc, tc.opt, tc.nanswers)
			}
			limit := 512
			if tc.edns > 0 {
				limit = tc.edns
			}
			if tc.udp && len(m) > limit {
				t.Errorf("%d bytes over UDP, limit %d", len(m), limit)
			}
		})
	}
}

func TestAnswerMalformed(t *testing.T) {
	z := testZone()
	if _, err := z.Answer([]byte{1, 2, 3}, true); err == nil {
		t.Error("a 3-byte query answered")
	}
	resp, err := z.Answer(query(t, "echo.default.svc.cluster.local.", dnsmessage.TypeA, 0), true)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := z.Answer(resp, true); err == nil {
		t.Error("a response answered as if a query (reflection loop)")
	}
	// Two questions: FORMERR.
	b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 4242})
	_ = b.StartQuestions()
	for range 2 {
		_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName("echo.default.svc.cluster.local."), Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET})
	}
	two, _ := b.Finish()
	m, err := z.Answer(two, true)
	if err != nil {
		t.Fatal(err)
	}
	if r := parse(t, m); r.rcode != dnsmessage.RCodeFormatError {
		t.Errorf("two questions: rcode %v, want FORMERR", r.rcode)
	}
	// Opcode other than QUERY: NOTIMP.
	q := query(t, "echo.default.svc.cluster.local.", dnsmessage.TypeA, 0)
	q[2] |= 5 << 3 // UPDATE
	m, err = z.Answer(q, true)
	if err != nil {
		t.Fatal(err)
	}
	if r := parse(t, m); r.rcode != dnsmessage.RCodeNotImplemented {
		t.Errorf("UPDATE: rcode %v, want NOTIMP", r.rcode)
	}
}

// TestServe: Go's own resolver, over UDP and over TCP, gets a Service's
// pods from the servers main runs.
func TestServe(t *testing.T) {
	z := testZone()
	load := func() *Zone { return z }
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	udpDone, tcpDone := make(chan error, 1), make(chan error, 1)
	go func() { udpDone <- serveUDP(pc, load) }()
	go func() { tcpDone <- serveTCP(ln, load) }()
	defer func() { pc.Close(); ln.Close(); <-udpDone; <-tcpDone }()
	for _, network := range []string{"udp", "tcp"} {
		addr := map[string]string{"udp": pc.LocalAddr().String(), "tcp": ln.Addr().String()}[network]
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}}
		got, err := r.LookupNetIP(context.Background(), "ip", "echo.default.svc.cluster.local.")
		if err != nil {
			t.Fatalf("%s: %v", network, err)
		}
		slices.SortFunc(got, netip.Addr.Compare)
		if want := addrs("10.244.0.4", "10.244.1.4", "fd00::4"); !slices.Equal(got, want) {
			t.Errorf("%s: %v, want %v", network, got, want)
		}
		if _, err := r.LookupNetIP(context.Background(), "ip", "nosuch.default.svc.cluster.local."); err == nil {
			t.Errorf("%s: an unknown Service resolved", network)
		} else if de, ok := err.(*net.DNSError); !ok || !de.IsNotFound {
			t.Errorf("%s: an unknown Service: %v, want not found", network, err)
		}
	}
}
