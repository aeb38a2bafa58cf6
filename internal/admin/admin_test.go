package admin_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
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
		// Only the fields Request names, and those of the structs it
		// holds (encoding/json matches names without regard to case).
		var top map[string]json.RawMessage
		_ = json.Unmarshal(b, &top)
		fields := jsonFields(reflect.TypeFor[admin.Request]())
		for k, v := range top {
			ft, ok := fields[strings.ToLower(k)]
			if !ok {
				t.Fatalf("%q: accepted the unknown field %q", b, k)
			}
			var inner map[string]json.RawMessage
			if ft.Kind() != reflect.Struct || json.Unmarshal(v, &inner) != nil {
				continue
			}
			innerFields := jsonFields(ft)
			for ik := range inner {
				if _, ok := innerFields[strings.ToLower(ik)]; !ok {
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

// jsonFields maps the lower-cased JSON names of struct type st's fields to
// their types, pointers taken away.
func jsonFields(st reflect.Type) map[string]reflect.Type {
	m := map[string]reflect.Type{}
	for f := range st.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "" {
			name = f.Name
		}
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		m[strings.ToLower(name)] = ft
	}
	return m
}
