package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/admin"
	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/echotest"
	"github.com/rdmavisor/rdmavisor/pkg/vconn"
)

// faultAt is the message number a faulty peer mishandles.
const faultAt = 7

// fault is what a peer does to message faultAt of the first vconn it
// accepts; it echoes every other message as the server does.
type fault int

const (
	faithful  fault = iota
	drop            // never echoes it
	duplicate       // echoes it twice
	swap            // echoes it after the next one
	corrupt         // echoes it with one byte changed
	hangUp          // closes the vconn instead of echoing it
)

// serveFaulty accepts vconns on ln until it closes; the first gets f.
func serveFaulty(ctx context.Context, ln *vconn.Listener, f fault) {
	var first atomic.Bool
	for {
		conn, err := ln.AcceptVConn()
		if err != nil {
			return
		}
		mine := f
		if !first.CompareAndSwap(false, true) {
			mine = faithful
		}
		go func() {
			defer conn.Close()
			var held []byte
			for {
				m, err := conn.RecvMsg(ctx)
				if err != nil {
					return
				}
				seq := binary.LittleEndian.Uint64(m.Data)
				out := [][]byte{m.Data}
				if seq == faultAt {
					switch mine {
					case drop:
						out = nil
					case duplicate:
						out = [][]byte{m.Data, m.Data}
					case swap:
						held, out = m.Data, nil
					case corrupt:
						m.Data[len(m.Data)/2] ^= 0x40
					case hangUp:
						return
					}
				} else if held != nil {
					out, held = [][]byte{m.Data, held}, nil
				}
				for _, b := range out {
					if conn.SendMsg(ctx, b) != nil {
						return
					}
				}
			}
		}()
	}
}

// TestVerdictByNumber runs the client against peers that each mishandle
// one numbered message of one of its two vconns, and tallies each
// client's verdict in the soak's table (echotest.WriteTable): a message
// dropped with no error, whether a later message shows it (4 in flight)
// or the client stops waiting (1 in flight), is "vanished without error";
// one echoed twice or late is duplicated or out of order; one changed is
// corrupt; a peer that hangs up fails its message in flight, with an
// error, and none vanishes.
func TestVerdictByNumber(t *testing.T) {
	cl, err := agenttest.Start(agenttest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := cl.Nodes[1].PodClient(ctx, admin.Pod{UID: "uid-server", Namespace: "default", Name: "echo-server", IPs: []string{"10.244.1.4"}}, "server", 16)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := cl.Nodes[0].PodClient(ctx, admin.Pod{UID: "uid-client", Namespace: "default", Name: "echo-client", IPs: []string{"10.244.0.4"}}, "client", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()

	const conns, n, size = 2, 20, 256
	type columns struct{ ok, failedInFlight, vanished, misordered, corrupt int64 }
	for i, tc := range []struct {
		name    string
		fault   fault
		window  int
		timeout time.Duration
		want    columns
		// what the verdict says of the faulty vconn, by number
		wantVConn func(VConn) bool
		wantErr   string
	}{
		{"faithful", faithful, 4, 20 * time.Second, columns{ok: 1}, nil, ""},
		{"drops one, 4 in flight", drop, 4, 20 * time.Second, columns{vanished: 1},
			func(r VConn) bool {
				return r.Sent == n && r.Delivered == n-1 && r.Vanished.N == 1 && r.Vanished.First[0] == faultAt && r.Failed.N == 0
			}, fmt.Sprintf("message %d came back before message %d", faultAt+1, faultAt)},
		{"drops one, 1 in flight", drop, 1, 2 * time.Second, columns{vanished: 1},
			func(r VConn) bool {
				return r.Sent == faultAt+1 && r.Delivered == faultAt && r.Vanished.N == 1 && r.Vanished.First[0] == faultAt && r.Failed.N == 0
			}, "with no error from the vconn"},
		{"duplicates one", duplicate, 1, 20 * time.Second, columns{misordered: 1},
			func(r VConn) bool {
				return r.Sent == n && r.Delivered == n && r.Duplicated.N == 1 && r.Duplicated.First[0] == faultAt
			}, fmt.Sprintf("message %d came back twice", faultAt)},
		{"swaps two", swap, 4, 20 * time.Second, columns{misordered: 1},
			func(r VConn) bool {
				return r.Sent == n && r.Delivered == n-1 && r.Vanished.N == 0 && r.Reordered.N == 1 && r.Reordered.First[0] == faultAt
			}, fmt.Sprintf("message %d came back before message %d", faultAt+1, faultAt)},
		{"corrupts one", corrupt, 4, 20 * time.Second, columns{corrupt: 1},
			func(r VConn) bool {
				return r.Sent == n && r.Delivered == n-1 && r.Corrupt.N == 1 && r.Corrupt.First[0] == faultAt
			}, fmt.Sprintf("message %d: message %d's byte %d is", faultAt, faultAt, size/2)},
		{"hangs up", hangUp, 1, 20 * time.Second, columns{failedInFlight: 1},
			func(r VConn) bool {
				return r.Sent == faultAt+1 && r.Delivered == faultAt && r.Failed.N == 1 && r.Failed.First[0] == faultAt && r.Vanished.N == 0
			}, "EOF"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			port := 7100 + i
			ln, err := srv.Listen(ctx, fmt.Sprintf(":%d", port))
			if err != nil {
				t.Fatal(err)
			}
			sctx, stop := context.WithCancel(ctx)
			defer stop()
			go serveFaulty(sctx, ln, tc.fault)
			defer ln.Close()

			cctx, ccancel := context.WithTimeout(ctx, tc.timeout)
			defer ccancel()
			var count counts
			_, err = client(cctx, cli, fmt.Sprintf("10.244.1.4:%d", port), conns, n, size, tc.window, &count)
			if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("client: %v, want an error containing %q", err, tc.wantErr)
			}
			// Through the file, as the soak reads it.
			path := filepath.Join(t.TempDir(), "verdict")
			writeVerdict(path, err, &count)
			v, err := echotest.ReadVerdict(path)
			if err != nil {
				t.Fatal(err)
			}
			if tc.wantVConn == nil {
				if len(v.VConns) != 0 || v.Sent != conns*n || v.Delivered != conns*n {
					t.Fatalf("verdict %+v, want every message delivered", v)
				}
			} else {
				var mine VConn
				b, _ := json.Marshal(v.VConns)
				var rs []VConn
				if err := json.Unmarshal(b, &rs); err != nil || len(rs) != 1 {
					t.Fatalf("verdict %+v: want one vconn reported (%v)", v, err)
				}
				mine = rs[0]
				if !tc.wantVConn(mine) {
					t.Fatalf("the faulty vconn: %+v", mine)
				}
			}
			var tally echotest.Tally
			tally.Add(v)
			var table bytes.Buffer
			echotest.WriteTable(&table, []echotest.Row{{From: "a", To: "b", Tally: tally, After: "-"}})
			got := tableCells(t, table.String(), "a → b")
			for col, want := range map[string]int64{
				"ok":                              tc.want.ok,
				"failed in flight, with an error": tc.want.failedInFlight,
				"vanished without error":          tc.want.vanished,
				"duplicated or out of order":      tc.want.misordered,
				"corrupt":                         tc.want.corrupt,
			} {
				if got[col] != fmt.Sprint(want) {
					t.Errorf("column %q is %q, want %d\n%s", col, got[col], want, table.String())
				}
			}
			if tc.want.vanished == 0 && tc.want.misordered == 0 && tc.want.corrupt == 0 != tally.Sound() {
				t.Errorf("tally %+v: Sound() = %v", tally, tally.Sound())
			}
		})
	}
}

// tableCells returns the cells of the table's row whose first cell is
// first, by column name.
func tableCells(t *testing.T, table, first string) map[string]string {
	t.Helper()
	split := func(line string) []string {
		cells := strings.Split(strings.Trim(line, "| "), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		return cells
	}
	lines := strings.Split(table, "\n")
	head := split(lines[0])
	for _, l := range lines[2:] {
		if cells := split(l); cells[0] == first {
			if len(cells) != len(head) {
				t.Fatalf("row %q has %d cells, the header %d", l, len(cells), len(head))
			}
			m := map[string]string{}
			for i, h := range head {
				m[h] = cells[i]
			}
			return m
		}
	}
	t.Fatalf("no row %q in\n%s", first, table)
	return nil
}

// TestVerdictJSON: echotest.Verdict, which the end-to-end suite reads, is
// a copy of the client's Verdict: every field survives the trip, and a
// verdict too large for a pod's termination message loses its vconns,
// not its totals.
func TestVerdictJSON(t *testing.T) {
	var count counts
	count.sent.Store(40)
	count.delivered.Store(30)
	for id := range 8 {
		r := VConn{ID: id, Sent: 5, Delivered: 1, Error: strings.Repeat("x", 400)}
		for s := range int64(4) {
			r.Failed.add(s + 1)
		}
		r.Vanished.add(1 << 40)
		r.Duplicated.add(2)
		r.Reordered.add(3)
		r.Corrupt.add(4)
		count.vconns = append(count.vconns, r)
	}
	want := verdictOf(errors.New("vconn 0: receive 1: "+io.EOF.Error()), &count)
	if want.Failed != 32 || want.Vanished != 8 || want.Duplicated != 8 || want.Reordered != 8 || want.Corrupt != 8 || len(want.VConns) != listed {
		t.Fatalf("verdict %+v: want the totals of 8 vconns and %d of them listed", want, listed)
	}
	b, _ := json.Marshal(want)
	var got echotest.Verdict
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&got); err != nil {
		t.Fatal(err)
	}
	back, _ := json.Marshal(got)
	var again Verdict
	if err := json.Unmarshal(back, &again); err != nil || !reflect.DeepEqual(again, want) {
		t.Fatalf("through echotest.Verdict: %+v, want %+v (%v)", again, want, err)
	}

	path := filepath.Join(t.TempDir(), "verdict")
	count.vconns = append(count.vconns, count.vconns...)
	for i := range count.vconns {
		count.vconns[i].Error = strings.Repeat("y", 2000)
	}
	writeVerdict(path, errors.New(strings.Repeat("z", 5000)), &count)
	v, err := echotest.ReadVerdict(path)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := json.Marshal(v); len(b) > maxVerdict || v.Failed != 64 || v.Vanished != 16 {
		t.Fatalf("a verdict of %d bytes, failed %d, vanished %d: want at most %d bytes and every total", len(b), v.Failed, v.Vanished, maxVerdict)
	}
}
