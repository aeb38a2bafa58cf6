package cni

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
)

// FuzzParseConfig: the plugin's stdin parser never panics, fails only with
// a CNI error of a documented code, and what it accepts is valid.
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","type":"rdmavisor-cni"}`,
		`{"cniVersion":"1.1.0","name":"n","type":"rdmavisor-cni","adminSocket":"/run/a.sock","failurePolicy":"fail-closed","timeout":"250ms","prevResult":` + testPrevResult + `}`,
		`{"cniVersion":"0.3.1","name":"n","prevResult":{"ips":[{"version":"4","address":"10.0.0.2/24"}]}}`,
		`{"cniVersion":"0.4.0","name":"n","prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"version":"6","address":"fd00::1/64","interface":0}]}}`,
		`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}]}`,
		`{"cniVersion":"9.9.9"}`, `{"cniVersion":"1.0.0","timeout":"-1s"}`, `{"cniVersion":`, `[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("not a CNI error: %v", err)
			}
			switch e.Code {
			case types.ErrDecodingFailure, types.ErrIncompatibleCNIVersion, types.ErrInvalidNetworkConfig:
			default:
				t.Fatalf("undocumented code %d: %v", e.Code, err)
			}
			return
		}
		if checkSocketPath(c.AdminSocket) != nil || (c.FailurePolicy != FailOpen && c.FailurePolicy != FailClosed) || c.Timeout <= 0 || c.Timeout > maxTimeout {
			t.Fatalf("accepted an invalid configuration: %+v", c)
		}
		if c.PrevResult != nil {
			// ADD reports a failed conversion as an error result; it must not panic.
			_, _ = c.PrevResult.GetAsVersion(c.CNIVersion)
		}
	})
}

// FuzzParseConf: the installer's parser never panics, and what it accepts
// gets exactly one entry on install and loses it on removal, keeping the
// other plugins.
func FuzzParseConf(f *testing.F) {
	for _, name := range []string{"bridge.conflist", "calico.conflist", "cilium.conflist", "flannel.conf", "malformed.conflist", "duplicate-key.conflist", "unknown-version.conflist"} {
		b, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	entry, _ := json.Marshal(testEntry)
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := parseConf(b)
		if err != nil {
			if !errors.Is(err, ErrNotUnderstood) {
				t.Fatalf("error is not ErrNotUnderstood: %v", err)
			}
			return
		}
		n, _ := c.withEntry(entry)
		out, err := n.marshal()
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		back, err := parseConf(out)
		if err != nil {
			t.Fatalf("the installed conflist does not parse: %v\n%s", err, out)
		}
		if len(back.ours()) != 1 {
			t.Fatalf("%d entries after install", len(back.ours()))
		}
		if again, changed := back.withEntry(entry); changed || len(again.plugins) != len(back.plugins) {
			t.Fatal("a second install changes the conflist")
		}
		others := c.withoutEntry().plugins
		if got := back.withoutEntry().plugins; len(got) != len(others) {
			t.Fatalf("removal left %d plugins, want %d", len(got), len(others))
		}
	})
}
