package clib_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/frame"
	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// harness is the parsers' C harness, one process for many inputs.
type harness struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Reader
}

func startHarness(t testing.TB) *harness {
	t.Helper()
	cmd := exec.Command(filepath.Join(build(t), "bin", "fuzz_harness"))
	cmd.Env = sanitizerEnv()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &harness{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() {
		_ = in.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("harness: %v\n%s", err, stderr.String())
		}
	})
	return h
}

// parse feeds b to the harness: its line.
func (h *harness) parse(t testing.TB, b []byte) string {
	t.Helper()
	var n [4]byte
	binary.LittleEndian.PutUint32(n[:], uint32(len(b)))
	if _, err := h.in.Write(append(n[:], b...)); err != nil {
		t.Fatalf("harness died: %v", err)
	}
	l, err := h.out.ReadString('\n')
	if err != nil {
		t.Fatalf("harness died on %x: %v", b, err)
	}
	return strings.TrimSuffix(l, "\n")
}

// want is the harness's line as package frame and package shm read b,
// but for the ring part, which only the harness reads.
func want(b []byte) string {
	var s strings.Builder
	if f, err := frame.Decode(b); err == nil {
		fmt.Fprintf(&s, "frame ok op=%d flags=%d req=%d handle=%d arg=%d arg2=%d len=%d", f.Op, f.Flags, f.Req, f.Handle, f.Arg, f.Arg2, len(f.Payload))
	} else {
		s.WriteString("frame err ")
		for name, e := range map[string]error{"short": frame.ErrShort, "version": frame.ErrVersion, "op": frame.ErrOp,
			"flags": frame.ErrFlags, "too-big": frame.ErrTooBig, "length": frame.ErrLength} {
			if strings.HasPrefix(err.Error(), e.Error()) {
				s.WriteString(name)
			}
		}
	}
	if h, err := frame.DecodeHello(b); err == nil {
		fmt.Fprintf(&s, " | hello ok %d %d %d %s", h.Quota, h.SendWindow, h.MaxMessage, hex.EncodeToString([]byte(h.Node)))
	} else {
		s.WriteString(" | hello err")
	}
	if l, err := shm.DecodeLayout(b); err == nil {
		fmt.Fprintf(&s, " | layout ok %d %d %d %d", l.Entries, l.Slab, l.MaxMessage, l.Size())
	} else {
		s.WriteString(" | layout err")
	}
	return s.String()
}

func compare(t testing.TB, h *harness, b []byte) {
	got := h.parse(t, b)
	w := want(b)
	if g, _, _ := strings.Cut(got, " | ring"); g != w {
		t.Fatalf("input %x:\n   libvconn: %s\npackage Go: %s", b, g, w)
	}
}

// docExamples are the datagrams of docs/protocol.md's frame and
// frame-invalid blocks, with the check each invalid one names.
func docExamples(t testing.TB) (valid [][]byte, invalid map[string]string) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	invalid = map[string]string{}
	lines := strings.Split(string(doc), "\n")
	for i, l := range lines {
		if (l != "```frame" && l != "```frame-invalid") || i+2 >= len(lines) {
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(lines[i+1], " ", ""))
		if err != nil {
			t.Fatalf("protocol.md:%d: %v", i+2, err)
		}
		if l == "```frame" {
			valid = append(valid, b)
		} else {
			invalid[string(b)] = strings.TrimPrefix(lines[i+2], "error=")
		}
	}
	if len(valid) < 10 || len(invalid) < 5 {
		t.Fatalf("protocol.md: %d frames, %d invalid ones", len(valid), len(invalid))
	}
	return valid, invalid
}

// TestCDecodesDocExamples: libvconn reads the document's examples as
// package frame does (which TestProtocolDocExamples holds to the
// document), and refuses the invalid ones for the reason the document
// gives.
func TestCDecodesDocExamples(t *testing.T) {
	h := startHarness(t)
	valid, invalid := docExamples(t)
	for _, b := range valid {
		compare(t, h, b)
		if !strings.HasPrefix(h.parse(t, b), "frame ok") {
			t.Errorf("%x: refused", b)
		}
	}
	for b, why := range invalid {
		compare(t, h, []byte(b))
		if got := h.parse(t, []byte(b)); !strings.HasPrefix(got, "frame err "+why+" ") {
			t.Errorf("%x: %s, the document says %s", b, got, why)
		}
	}
	// Payload shapes: the Hello info and shm layout of the document.
	compare(t, h, frame.AppendHello(nil, frame.HelloInfo{Quota: 4, SendWindow: 16, MaxMessage: 65536, Node: "node-a"}))
	compare(t, h, shm.AppendLayout(nil, shm.DefaultLayout))
}

// FuzzCDecode feeds arbitrary bytes through libvconn's parsers (frames,
// Hello info, shm layouts, a ring RX an agent wrote) under the
// sanitizers, and checks that the frame, Hello and layout parsers agree
// with package frame's and shm's.
func FuzzCDecode(f *testing.F) {
	valid, invalid := docExamples(f)
	for _, b := range valid {
		f.Add(b)
	}
	for b := range invalid {
		f.Add([]byte(b))
	}
	f.Add(shm.AppendLayout(nil, shm.DefaultLayout))
	// A ring with one good descriptor and one out of bounds.
	ring := make([]byte, 256+4*16+256)
	ring[0] = 2 // tail
	copy(ring[256:], []byte{64, 0, 0, 0, 5, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0})
	copy(ring[272:], []byte{250, 0, 0, 0, 100, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(ring)
	h := startHarness(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > frame.MaxFrame+8 {
			return
		}
		compare(t, h, b)
	})
}
