package preload_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rdmavisor/rdmavisor/internal/bench"
)

// iperf3, redis and curl against http.server, over vconns and over TCP
// (TestUnmodifiedPrograms), and the table of their figures.

// paired measures figures over vconns (vconn gives one value of each) and
// over TCP (tcp) h.rounds times, in turns, the first of a round
// alternating, so that a change in the machine's speed (other work on its
// cores) hits both alike; it reports the medians of each path's values and
// the median of the rounds' ratios.
func (h *harness) paired(program string, figures []string, unit string, vconn, tcp func() []float64) {
	var v, p [][]float64
	for r := range h.rounds {
		if r%2 == 0 {
			v = append(v, vconn())
			p = append(p, tcp())
		} else {
			p = append(p, tcp())
			v = append(v, vconn())
		}
	}
	for i, f := range figures {
		var vs, ps, ratios []float64
		for r := range v {
			vs, ps = append(vs, v[r][i]), append(ps, p[r][i])
			ratios = append(ratios, v[r][i]/p[r][i])
		}
		fmt.Fprintf(h.report, "| %s | %s | %s %s | %s %s | %.2f |\n", program, f, num(bench.Median(vs)), unit, num(bench.Median(ps)), unit, bench.Median(ratios))
	}
}

// num writes x with three significant digits, or whole above 1000.
func num(x float64) string {
	if x >= 1000 {
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	return strconv.FormatFloat(x, 'g', 3, 64)
}

// TestUnmodifiedPrograms runs iperf3, redis and curl against
// http.server, each over vconns and over TCP, and checks every byte.
func TestUnmodifiedPrograms(t *testing.T) {
	need(t, "make", "cc", "iperf3", "redis-server", "redis-cli", "redis-benchmark", "curl", "python3")
	h := newHarness(t)
	fmt.Fprintln(h.report, "| program | figure | over vconns | over TCP | vconns/TCP |")
	fmt.Fprintln(h.report, "|---|---|---:|---:|---:|")
	t.Run("iperf3", h.iperf3)
	t.Run("redis", h.redis)
	t.Run("http", h.http)
	t.Logf("unmodified programs between two agents (soft provider, UDP on loopback), each over TCP in the same run:\n%s", h.report)
	if p := os.Getenv("RDMAVISOR_PRELOAD_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(h.report.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func (h *harness) iperf3(t *testing.T) {
	h.servers(t, "iperf3")
	const vport, tport = 5201, 5202
	h.start(h.env(h.server, "", strconv.Itoa(vport)), "iperf3", "-s", "-p", strconv.Itoa(vport))
	h.waitListen(1)
	h.start(os.Environ(), "iperf3", "-s", "-B", h.ip, "-p", strconv.Itoa(tport))
	waitTCP(t, fmt.Sprintf("%s:%d", h.ip, tport))
	for _, reverse := range []bool{false, true} {
		dir := "client to server"
		args := []string{"-c", h.ip, "-t", "3", "-J"}
		if reverse {
			dir, args = "server to client", append(args, "-R")
		}
		h.paired("iperf3", []string{"throughput, " + dir}, "Mbit/s", func() []float64 {
			return []float64{h.iperfClient(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, vport), ""), append(args, "-p", strconv.Itoa(vport))) / 1e6}
		}, func() []float64 {
			return []float64{h.iperfClient(os.Environ(), append(args, "-p", strconv.Itoa(tport))) / 1e6}
		})
	}
}

// iperfClient runs an iperf3 client and gives the rate the receiver
// measured. The iperf3 server closes its listening socket at the end of a
// test and opens a new one for the next (its "Server listening on PORT
// (test #N)"), so a client that comes right after another (a round's last
// run, then the next round's first on the same path) may find nothing
// listening, more so through the preload library, whose listen asks the
// agent, on a busy machine: it tries again for a few seconds.
func (h *harness) iperfClient(env, args []string) float64 {
	h.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		cmd := exec.CommandContext(ctx, "iperf3", args...)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		cancel()
		var r iperfReport
		perr := json.Unmarshal(out, &r)
		if perr == nil && strings.Contains(r.Error, "unable to connect") && time.Now().Before(deadline) {
			h.t.Logf("iperf3 %s: %s: again", strings.Join(args, " "), r.Error)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if perr != nil {
			h.t.Fatalf("iperf3 %s: %v, -J: %v\n%s%s", strings.Join(args, " "), err, perr, out, stderr.Bytes())
		}
		if err != nil || r.Error != "" || r.End.SumReceived.Bytes == 0 {
			h.t.Fatalf("iperf3 %s: %v: error %q, %d bytes received\n%s", strings.Join(args, " "), err, r.Error, r.End.SumReceived.Bytes, stderr.Bytes())
		}
		return r.End.SumReceived.BitsPerSecond
	}
}

// iperfReport is what iperf3 -J reports: the receiver's count.
type iperfReport struct {
	End struct {
		SumReceived struct {
			BitsPerSecond float64 `json:"bits_per_second"`
			Bytes         int64   `json:"bytes"`
		} `json:"sum_received"`
	} `json:"end"`
	Error string `json:"error"`
}

func (h *harness) redis(t *testing.T) {
	h.servers(t, "redis")
	const vport, tport = 6379, 6380
	common := []string{"--save", "", "--appendonly", "no", "--protected-mode", "no"}
	h.start(h.env(h.server, "", strconv.Itoa(vport)), "redis-server", append([]string{"--port", strconv.Itoa(vport), "--bind", h.ip}, common...)...)
	h.waitListen(1)
	h.start(os.Environ(), "redis-server", append([]string{"--port", strconv.Itoa(tport), "--bind", h.ip}, common...)...)
	waitTCP(t, fmt.Sprintf("%s:%d", h.ip, tport))
	venv := h.env(h.client, fmt.Sprintf("%s:%d", h.ip, vport), "")
	// Every reply checked: 2,000 keys of random values written, then
	// read back through redis-cli, reply by reply.
	for _, c := range []struct {
		env  []string
		port int
	}{{venv, vport}, {os.Environ(), tport}} {
		var set, get bytes.Buffer
		want := make([]string, 2000)
		for i := range want {
			b := make([]byte, 12)
			_, _ = rand.Read(b)
			want[i] = fmt.Sprintf("%x", b)
			fmt.Fprintf(&set, "SET key:%d %s\n", i, want[i])
			fmt.Fprintf(&get, "GET key:%d\n", i)
		}
		args := []string{"-h", h.ip, "-p", strconv.Itoa(c.port)}
		okays := strings.Fields(string(h.run(c.env, set.Bytes(), "redis-cli", args...)))
		if len(okays) != len(want) || strings.Count(strings.Join(okays, " "), "OK") != len(want) {
			t.Fatalf("port %d: SET replies: %d, want %d OK", c.port, len(okays), len(want))
		}
		got := strings.Fields(string(h.run(c.env, get.Bytes(), "redis-cli", args...)))
		if len(got) != len(want) {
			t.Fatalf("port %d: GET replies: %d, want %d", c.port, len(got), len(want))
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("port %d: GET key:%d = %q, want %q", c.port, i, got[i], want[i])
			}
		}
	}
	// redis-benchmark at 1, 8 and 32 clients (connections at once, each
	// with one request outstanding); a quarter of the requests when no
	// report is asked for (a check, in CI under -race).
	div := 4
	if os.Getenv("RDMAVISOR_PRELOAD_REPORT") != "" {
		div = 1
	}
	for _, c := range []struct{ clients, requests int }{{1, 10000}, {8, 20000}, {32, 20000}} {
		bench := func(env []string, port int) []float64 {
			out := h.run(env, nil, "redis-benchmark", "-h", h.ip, "-p", strconv.Itoa(port), "-n", strconv.Itoa(c.requests/div),
				"-c", strconv.Itoa(c.clients), "-t", "set,get", "--csv")
			return []float64{csvRate(t, out, "SET"), csvRate(t, out, "GET")}
		}
		clients := fmt.Sprintf("%d client", c.clients)
		if c.clients > 1 {
			clients += "s"
		}
		h.paired("redis-benchmark", []string{"SET requests/s, " + clients, "GET requests/s, " + clients}, "req/s",
			func() []float64 { return bench(venv, vport) }, func() []float64 { return bench(os.Environ(), tport) })
	}
}

var csvLine = regexp.MustCompile(`^"([A-Z]+)","([\d.]+)"`)

func csvRate(t *testing.T, out []byte, test string) float64 {
	t.Helper()
	for _, l := range strings.Split(string(out), "\n") {
		if m := csvLine.FindStringSubmatch(l); m != nil && m[1] == test {
			v, err := strconv.ParseFloat(m[2], 64)
			if err == nil && v > 0 {
				return v
			}
		}
	}
	t.Fatalf("redis-benchmark --csv: no %s rate in\n%s", test, out)
	return 0
}

func (h *harness) http(t *testing.T) {
	h.servers(t, "http")
	const vport, tport = 8000, 8001
	root := t.TempDir()
	data := make([]byte, 64<<20)
	_, _ = rand.Read(data)
	if err := os.WriteFile(filepath.Join(root, "blob"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	for _, c := range []struct {
		env  []string
		port int
	}{{h.env(h.server, "", strconv.Itoa(vport)), vport}, {os.Environ(), tport}} {
		srv := h.start(c.env, "python3", "-m", "http.server", strconv.Itoa(c.port), "--bind", h.ip, "--directory", root)
		_ = srv
	}
	h.waitListen(1)
	waitTCP(t, fmt.Sprintf("%s:%d", h.ip, tport))
	get := func(env []string, port int) float64 {
		out := filepath.Join(t.TempDir(), "blob")
		speed := h.run(env, nil, "curl", "-sS", "--fail", "-o", out, "-w", "%{speed_download}", fmt.Sprintf("http://%s:%d/blob", h.ip, port))
		got, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if sha256.Sum256(got) != sum {
			t.Fatalf("port %d: the file fetched (%d bytes) differs from the one served (%d)", port, len(got), len(data))
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(string(speed)), 64)
		if err != nil {
			t.Fatalf("curl speed %q: %v", speed, err)
		}
		return v
	}
	h.paired("curl ← python3 -m http.server", []string{"64 MiB file, checksum equal"}, "MB/s", func() []float64 {
		return []float64{get(h.env(h.client, fmt.Sprintf("%s:%d", h.ip, vport), ""), vport) / 1e6}
	}, func() []float64 {
		return []float64{get(os.Environ(), tport) / 1e6}
	})
}
