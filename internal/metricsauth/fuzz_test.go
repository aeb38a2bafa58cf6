package metricsauth

import (
	"bytes"
	"testing"
)

// FuzzParseCA: any bytes in the ConfigMap's client-ca-file either parse
// into a pool of at least one certificate or are refused with an error;
// never a panic.
func FuzzParseCA(f *testing.F) {
	f.Add([]byte(""))
	f.Add([]byte("not PEM"))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"))
	f.Add(bytes.Repeat([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"), 3))
	f.Fuzz(func(t *testing.T, data []byte) {
		ca, err := parseCA(data)
		if err != nil {
			if ca != nil {
				t.Fatalf("an error (%v) and a CA", err)
			}
			return
		}
		if ca.n < 1 || ca.pool == nil {
			t.Fatalf("accepted with %d certificates", ca.n)
		}
	})
}
