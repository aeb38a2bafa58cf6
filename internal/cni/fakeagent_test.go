package cni

import (
	"encoding/json"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/rdmavisor/rdmavisor/internal/admin"
)

// fakeAgent serves the admin protocol with handle, which returns the reply
// to send, or nil to close the connection without one; hang makes it
// never answer. It records the requests.
type fakeAgent struct {
	sock   string
	mu     sync.Mutex
	reqs   []admin.Request
	handle func(admin.Request) *admin.Reply
	hang   bool
}

func startFakeAgent(t *testing.T, hang bool, handle func(admin.Request) *admin.Reply) *fakeAgent {
	t.Helper()
	f := &fakeAgent{sock: filepath.Join(t.TempDir(), "admin.sock"), handle: handle, hang: hang}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: f.sock, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conns []*net.UnixConn
	t.Cleanup(func() {
		_ = ln.Close()
		f.mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		f.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			f.mu.Lock()
			conns = append(conns, c)
			f.mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 1<<16)
				for {
					n, err := c.Read(buf)
					if err != nil || n == 0 {
						return
					}
					req, err := admin.DecodeRequest(buf[:n])
					if err != nil {
						return
					}
					f.mu.Lock()
					f.reqs = append(f.reqs, req)
					f.mu.Unlock()
					if f.hang {
						continue
					}
					rep := f.handle(req)
					if rep == nil {
						return
					}
					rep.Version = admin.Version
					b, _ := json.Marshal(rep)
					if _, err := c.Write(b); err != nil {
						return
					}
				}
			})
		}
	})
	return f
}

func (f *fakeAgent) ops() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var ops []string
	for _, r := range f.reqs {
		ops = append(ops, r.Op+":"+r.ID)
	}
	return ops
}

// TestDelWhenListFails: DEL still unregisters the pod when listing the
// pods fails (the connection is closed), on a fresh connection.
func TestDelWhenListFails(t *testing.T) {
	bin := buildPlugin(t)
	f := startFakeAgent(t, false, func(req admin.Request) *admin.Reply {
		if req.Op == admin.OpListPods {
			return nil // as the agent does when a reply cannot be sent
		}
		return &admin.Reply{}
	})
	conf := netConf("1.0.0", f.sock, "fail-open", "")
	if r := execPlugin(bin, "DEL", conf, podEnv("ctr-1", "uid-1")...); r.err != nil {
		t.Fatalf("DEL: %v: %s", r.err, r.stdout)
	}
	if got, want := strings.Join(f.ops(), " "), "listPods: unregisterPod:uid-1"; got != want {
		t.Errorf("requests %q, want %q", got, want)
	}
}

// TestHungAgent: an agent that accepts but never answers bounds every
// command by the configured timeout; fail-open still starts the pod.
func TestHungAgent(t *testing.T) {
	bin := buildPlugin(t)
	f := startFakeAgent(t, true, nil)
	withTimeout := func(policy, prev string) string {
		return strings.Replace(netConf("1.0.0", f.sock, policy, prev), `"name"`, `"timeout":"300ms","name"`, 1)
	}
	env := podEnv("ctr-1", "uid-1")
	for _, tc := range []struct {
		name, command, conf string
		code                uint // 0: success
	}{
		{"fail-open ADD", "ADD", withTimeout("fail-open", testPrevResult), 0},
		{"fail-closed ADD", "ADD", withTimeout("fail-closed", testPrevResult), types.ErrTryAgainLater},
		{"DEL", "DEL", withTimeout("fail-closed", ""), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := execPlugin(bin, tc.command, tc.conf, env...)
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("%s took %v with a 300ms timeout", tc.command, d)
			}
			if tc.code == 0 {
				if r.err != nil {
					t.Fatalf("%v: %s", r.err, r.stdout)
				}
				if tc.command == "ADD" {
					sameJSON(t, r.stdout, testPrevResult)
				}
				return
			}
			if e := r.cniError(t); e.Code != tc.code {
				t.Errorf("code %d (%s), want %d", e.Code, e.Msg, tc.code)
			}
		})
	}
}
