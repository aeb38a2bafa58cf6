package admin_test

import (
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{`{"version":1,"op":"status"}`, `{"version":1,"op":"createAllocation","allocation":{"id":"a","vconns":3}}`,
		`{"version":1,"op":"registerPod","pod":{"uid":"u","namespace":"n","name":"p","ips":["10.0.0.1"]}}`, `{`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = admin.DecodeRequest(b)
	})
}
