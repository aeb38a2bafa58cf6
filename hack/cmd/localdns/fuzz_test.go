package main

import (
	"testing"

	"golang.org/x/net/dns/dnsmessage"
)

// FuzzAnswer: no query, however malformed, panics the server, and every
// answer it gives is a well-formed response to that query's ID.
func FuzzAnswer(f *testing.F) {
	for _, s := range []struct {
		name string
		typ  dnsmessage.Type
		edns int
	}{
		{"echo.default.svc.cluster.local.", dnsmessage.TypeA, 0},
		{"echo.default.svc.default.svc.cluster.local.", dnsmessage.TypeAAAA, 1232},
		{"default.svc.cluster.local.", dnsmessage.TypeSRV, 4096},
		{"example.com.", dnsmessage.TypeA, 0},
	} {
		f.Add(query(f, s.name, s.typ, s.edns), true)
	}
	f.Add([]byte{}, false)
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12}, true) // a pointer loop
	z := testZone()
	f.Fuzz(func(t *testing.T, msg []byte, udp bool) {
		out, err := z.Answer(msg, udp)
		if err != nil {
			return
		}
		var m dnsmessage.Message
		if err := m.Unpack(out); err != nil {
			t.Fatalf("an unparseable response %x: %v", out, err)
		}
		if !m.Response || len(msg) < 2 || m.ID != uint16(msg[0])<<8|uint16(msg[1]) {
			t.Fatalf("response header %+v to query %x", m.Header, msg)
		}
		if udp && len(out) > maxUDPSize {
			t.Fatalf("%d bytes over UDP", len(out))
		}
	})
}
