package admin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// FuzzDecodeRequest: DecodeRequest accepts exactly one JSON document of
// known fields within MaxMessage, and what it accepts means the same once
// the client encodes it again (json.Marshal, as Client.do sends it): the
// encoding is a fixed point, and decoding it gives the same request. Its
// errors say what was wrong.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"version":1,"op":"status"}`, `{"version":1,"op":"createAllocation","allocation":{"id":"a","vconns":3}}`,
		`{"version":1,"op":"registerPod","pod":{"uid":"u","namespace":"n","name":"p","ips":["10.0.0.1"]}}`, `{`, ``,
		`{"version":1,"op":"status"} {}`, `{"version":1,"op":"status","extra":1}`, `{"VERSION":1,"Op":"status"}`,
		`{"version":1,"pod":{"uid":"\xff","ips":[]}}`, `{"version":"1"}`, `{"allocation":null,"pod":{}}`, `null`, `[]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := admin.DecodeRequest(b)
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, "decoding request: ") &&
				msg != "trailing data after the request" && msg != "request larger than 64 KiB" {
				t.Fatalf("%q: error %q says neither what failed to decode nor why", b, msg)
			}
			if strings.HasPrefix(msg, "decoding request: ") && errors.Unwrap(err) == nil {
				t.Fatalf("%q: %v does not wrap encoding/json's error", b, err)
			}
			if len(b) > admin.MaxMessage && err.Error() != "request larger than 64 KiB" {
				t.Fatalf("%d bytes: %v, want the size named", len(b), err)
			}
			return
		}
		if len(b) > admin.MaxMessage {
			t.Fatalf("accepted %d bytes, over MaxMessage", len(b))
		}
		if !json.Valid(b) {
			t.Fatalf("accepted %q, which is not one JSON document", b)
		}
		// Only the fields Request names (encoding/json matches them
		// without regard to case).
		known := map[string][]string{"": {"version", "op", "allocation", "id", "pod"},
			"allocation": {"id", "vconns", "socket", "inuse", "podscoped", "pod"},
			"pod":        {"uid", "namespace", "name", "ips", "netns", "containerid"}}
		var top map[string]json.RawMessage
		_ = json.Unmarshal(b, &top)
		for k, v := range top {
			k = strings.ToLower(k)
			if !slices.Contains(known[""], k) {
				t.Fatalf("%q: accepted the unknown field %q", b, k)
			}
			var inner map[string]json.RawMessage
			_ = json.Unmarshal(v, &inner)
			for ik := range inner {
				if !slices.Contains(known[k], strings.ToLower(ik)) {
					t.Fatalf("%q: accepted the unknown field %s.%s", b, k, ik)
				}
			}
		}
		out, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("encoding %+v: %v", req, err)
		}
		again, err := admin.DecodeRequest(out)
		if err != nil {
			t.Fatalf("%q decoded, its encoding %s does not: %v", b, out, err)
		}
		out2, err := json.Marshal(again)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out, out2) {
			t.Fatalf("%q: encoded as %s, then as %s", b, out, out2)
		}
		if again.Version != req.Version || again.Op != req.Op || again.ID != req.ID ||
			(again.Allocation == nil) != (req.Allocation == nil) || (again.Pod == nil) != (req.Pod == nil) {
			t.Fatalf("%q: decoded %+v, after a round trip %+v", b, req, again)
		}
	})
}
