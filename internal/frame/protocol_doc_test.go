package frame

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/shm"
)

// protocolDoc is the written protocol, whose examples this package must
// decode as the document says.
const protocolDoc = "../../docs/protocol.md"

// docBlock is one machine-read fenced block of docs/protocol.md: its kind
// (the fence's info string), the bytes of its hex line, and the fields of
// its last line.
type docBlock struct {
	kind   string
	line   int
	raw    []byte
	fields map[string]string
}

// docBlocks reads every fenced block of the given kinds from the
// document. The block's first line is hex (spaces ignored) unless the
// kind has none (vconn-info); its last line is key=value fields, where a
// value may be a quoted string.
func docBlocks(tb testing.TB, kinds ...string) []docBlock {
	tb.Helper()
	b, err := os.ReadFile(protocolDoc)
	if err != nil {
		tb.Fatal(err)
	}
	want := map[string]bool{}
	for _, k := range kinds {
		want[k] = true
	}
	var (
		out   []docBlock
		cur   *docBlock
		lines []string
	)
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case cur == nil && strings.HasPrefix(l, "```") && want[strings.TrimPrefix(l, "```")]:
			cur, lines = &docBlock{kind: strings.TrimPrefix(l, "```"), line: n}, nil
		case cur != nil && l == "```":
			if len(lines) == 0 {
				tb.Fatalf("%s:%d: empty %s block", protocolDoc, cur.line, cur.kind)
			}
			if cur.kind != "vconn-info" {
				if cur.raw, err = hex.DecodeString(strings.ReplaceAll(lines[0], " ", "")); err != nil {
					tb.Fatalf("%s:%d: hex: %v", protocolDoc, cur.line, err)
				}
			}
			if cur.fields, err = parseFields(lines[len(lines)-1]); err != nil {
				tb.Fatalf("%s:%d: %v", protocolDoc, cur.line, err)
			}
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			lines = append(lines, l)
		}
	}
	if len(out) == 0 {
		tb.Fatalf("%s: no blocks of %v", protocolDoc, kinds)
	}
	return out
}

// parseFields reads `k=v k="quoted text" k=hex:0a0b`.
func parseFields(l string) (map[string]string, error) {
	m := map[string]string{}
	for l = strings.TrimSpace(l); l != ""; l = strings.TrimSpace(l) {
		k, rest, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("field %q: no =", l)
		}
		var v string
		if strings.HasPrefix(rest, `"`) {
			q, err := strconv.QuotedPrefix(rest)
			if err != nil {
				return nil, fmt.Errorf("field %s: %w", k, err)
			}
			v, _ = strconv.Unquote(q)
			rest = rest[len(q):]
		} else {
			v, rest, _ = strings.Cut(rest, " ")
		}
		m[k] = v
		l = rest
	}
	return m, nil
}

func num(tb testing.TB, b docBlock, k string) uint64 {
	tb.Helper()
	v, ok := b.fields[k]
	if !ok {
		tb.Fatalf("%s:%d: no field %s", protocolDoc, b.line, k)
	}
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil {
		tb.Fatalf("%s:%d: field %s: %v", protocolDoc, b.line, k, err)
	}
	return n
}

func payloadOf(tb testing.TB, b docBlock) []byte {
	tb.Helper()
	v := b.fields["payload"]
	if h, ok := strings.CutPrefix(v, "hex:"); ok {
		p, err := hex.DecodeString(h)
		if err != nil {
			tb.Fatalf("%s:%d: payload: %v", protocolDoc, b.line, err)
		}
		return p
	}
	return []byte(v)
}

func opNamed(tb testing.TB, b docBlock) Op {
	tb.Helper()
	for o := OpHello; o < opLimit; o++ {
		if o.String() == b.fields["op"] {
			return o
		}
	}
	tb.Fatalf("%s:%d: no op %q", protocolDoc, b.line, b.fields["op"])
	return 0
}

// TestProtocolDocExamples checks every example of docs/protocol.md: each
// frame decodes to the fields stated and encodes back to its bytes; each
// invalid one is refused by the check named; the payload examples decode
// as stated.
func TestProtocolDocExamples(t *testing.T) {
	for _, b := range docBlocks(t, "frame") {
		want := Frame{Op: opNamed(t, b), Flags: uint16(num(t, b, "flags")), Req: uint32(num(t, b, "req")),
			Handle: uint32(num(t, b, "handle")), Arg: uint32(num(t, b, "arg")), Arg2: num(t, b, "arg2"), Payload: payloadOf(t, b)}
		got, err := Decode(b.raw)
		if err != nil {
			t.Errorf("%s:%d: %v", protocolDoc, b.line, err)
			continue
		}
		if len(got.Payload) == 0 && len(want.Payload) == 0 {
			got.Payload = want.Payload
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s:%d: decoded %+v, the document says %+v", protocolDoc, b.line, got, want)
		}
		if enc, _ := Append(nil, &want); !bytes.Equal(enc, b.raw) {
			t.Errorf("%s:%d: encoded %x, the document shows %x", protocolDoc, b.line, enc, b.raw)
		}
	}
	errs := map[string]error{"short": ErrShort, "version": ErrVersion, "op": ErrOp, "flags": ErrFlags, "too-big": ErrTooBig, "length": ErrLength}
	for _, b := range docBlocks(t, "frame-invalid") {
		want, ok := errs[b.fields["error"]]
		if !ok {
			t.Fatalf("%s:%d: unknown error %q", protocolDoc, b.line, b.fields["error"])
		}
		if _, err := Decode(b.raw); !errors.Is(err, want) {
			t.Errorf("%s:%d: Decode: %v, the document says %v", protocolDoc, b.line, err, want)
		}
	}
	for _, b := range docBlocks(t, "hello-info") {
		h, err := DecodeHello(b.raw)
		want := HelloInfo{Quota: uint32(num(t, b, "quota")), SendWindow: uint32(num(t, b, "sendwindow")),
			MaxMessage: uint32(num(t, b, "maxmessage")), Node: b.fields["node"]}
		if err != nil || h != want {
			t.Errorf("%s:%d: DecodeHello: %+v, %v; the document says %+v", protocolDoc, b.line, h, err, want)
		}
	}
	for _, b := range docBlocks(t, "vconn-info") {
		v := VConnInfoOf(num(t, b, "arg2"))
		name := b.fields["transport"]
		if name == "unknown" {
			name = ""
		}
		if v.Transport.String() != name || uint64(v.MaxMessage) != num(t, b, "maxmessage") ||
			strconv.FormatBool(v.Transport.Reliable()) != b.fields["reliable"] {
			t.Errorf("%s:%d: VConnInfoOf: %+v (reliable %v), the document says %v", protocolDoc, b.line, v, v.Transport.Reliable(), b.fields)
		}
	}
	for _, b := range docBlocks(t, "shm-layout") {
		l, err := shm.DecodeLayout(b.raw)
		want := shm.Layout{Entries: uint32(num(t, b, "entries")), Slab: uint32(num(t, b, "slab")), MaxMessage: uint32(num(t, b, "maxmessage"))}
		if err != nil || l != want || uint64(l.Size()) != num(t, b, "size") || 2*num(t, b, "ringlen") != num(t, b, "size") {
			t.Errorf("%s:%d: DecodeLayout: %+v (size %d), %v; the document says %v", protocolDoc, b.line, l, l.Size(), err, b.fields)
		}
	}
	for _, b := range docBlocks(t, "shm-desc") {
		if len(b.raw) != shm.DescLen {
			t.Fatalf("%s:%d: a descriptor of %d bytes, want %d", protocolDoc, b.line, len(b.raw), shm.DescLen)
		}
		le := func(i int) uint64 {
			return uint64(b.raw[i]) | uint64(b.raw[i+1])<<8 | uint64(b.raw[i+2])<<16 | uint64(b.raw[i+3])<<24
		}
		for i, k := range []string{"off", "len", "imm", "flags"} {
			if le(4*i) != num(t, b, k) {
				t.Errorf("%s:%d: descriptor %s is %#x, the document says %s", protocolDoc, b.line, k, le(4*i), b.fields[k])
			}
		}
	}
}

// docSeeds are the document's example datagrams, valid and not, for the
// fuzz targets.
func docSeeds(tb testing.TB) [][]byte {
	var out [][]byte
	for _, b := range docBlocks(tb, "frame", "frame-invalid") {
		out = append(out, b.raw)
	}
	return out
}
