package protocol

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// protocolDoc is the written protocol this suite holds the agent to.
const protocolDoc = "../../docs/protocol.md"

func readDoc(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(protocolDoc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var (
	// ruleDef is a rule's label where the document states it.
	ruleDef = regexp.MustCompile(`\*\*\[(R\d+\.\d+)\]\*\*`)
	// ruleRef is any mention of a rule.
	ruleRef = regexp.MustCompile(`\bR\d+\.\d+\b`)
)

// docRules are the rules the document labels, in its order.
func docRules(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, m := range ruleDef.FindAllSubmatch(readDoc(t), -1) {
		out = append(out, string(m[1]))
	}
	if len(out) == 0 {
		t.Fatalf("%s labels no rule", protocolDoc)
	}
	return out
}

// TestRulesHaveCases holds the table of cases and the document together:
// every rule the document labels has a case, every case checks a rule it
// labels, no label is defined twice, and every rule the document refers
// to (R8.5 in its text) is one it defines.
func TestRulesHaveCases(t *testing.T) {
	rules := docRules(t)
	defined := map[string]bool{}
	for _, r := range rules {
		if defined[r] {
			t.Errorf("%s defines rule %s twice", protocolDoc, r)
		}
		defined[r] = true
	}
	for _, r := range ruleRef.FindAll(readDoc(t), -1) {
		if !defined[string(r)] {
			t.Errorf("%s refers to rule %s, which it does not define", protocolDoc, r)
		}
	}
	covered := map[string]int{}
	for _, c := range cases {
		if !defined[c.rule] {
			t.Errorf("case %q checks rule %s, which %s does not define", c.name, c.rule, protocolDoc)
		}
		covered[c.rule]++
	}
	for _, r := range rules {
		if covered[r] == 0 {
			t.Errorf("rule %s of %s has no case", r, protocolDoc)
		}
	}
	bySection := map[string][]string{}
	var sections []string
	for _, r := range rules {
		sec, _, _ := strings.Cut(r, ".")
		if bySection[sec] == nil {
			sections = append(sections, sec)
		}
		bySection[sec] = append(bySection[sec], fmt.Sprintf("%s (%d)", r, covered[r]))
	}
	for _, sec := range sections {
		t.Logf("§%s: %s", strings.TrimPrefix(sec, "R"), strings.Join(bySection[sec], ", "))
	}
	t.Logf("%d cases cover the %d rules of %s", len(cases), len(rules), protocolDoc)
}

// example is one `frame` block of the document: its datagram, who sends
// it to whom ("A → agent", "agent → B"), and the fields it states.
type example struct {
	line   int
	raw    []byte
	from   string // "A", "B" or "agent"
	to     string
	fields map[string]string
}

// examples reads the document's frame blocks, in order.
func examples(t *testing.T) []example {
	t.Helper()
	var (
		out   []example
		start int
		lines []string
	)
	sc := bufio.NewScanner(bytes.NewReader(readDoc(t)))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		switch {
		case start == 0 && l == "```frame":
			start, lines = n, nil
		case start != 0 && l == "```":
			if len(lines) != 3 {
				t.Fatalf("%s:%d: a frame block has the hex, who sends it to whom, and the fields: %d lines", protocolDoc, start, len(lines))
			}
			raw, err := hex.DecodeString(strings.ReplaceAll(lines[0], " ", ""))
			if err != nil {
				t.Fatalf("%s:%d: %v", protocolDoc, start, err)
			}
			from, to, ok := strings.Cut(lines[1], " → ")
			if !ok {
				t.Fatalf("%s:%d: %q: want \"A → agent\" or \"agent → B\"", protocolDoc, start, lines[1])
			}
			fields, err := parseFields(lines[2])
			if err != nil {
				t.Fatalf("%s:%d: %v", protocolDoc, start, err)
			}
			out = append(out, example{line: start, raw: raw, from: from, to: to, fields: fields})
			start = 0
		case start != 0:
			lines = append(lines, l)
		}
	}
	return out
}

// invalidExamples reads the frame-invalid blocks: each datagram and the
// check the document says refuses it.
func invalidExamples(t *testing.T) (raws [][]byte, checks []string) {
	t.Helper()
	lines := strings.Split(string(readDoc(t)), "\n")
	for i, l := range lines {
		if l != "```frame-invalid" || i+2 >= len(lines) {
			continue
		}
		b, err := hex.DecodeString(strings.ReplaceAll(lines[i+1], " ", ""))
		if err != nil {
			t.Fatalf("%s:%d: %v", protocolDoc, i+2, err)
		}
		raws = append(raws, b)
		checks = append(checks, strings.TrimPrefix(lines[i+2], "error="))
	}
	if len(raws) == 0 {
		t.Fatalf("%s: no frame-invalid block", protocolDoc)
	}
	return raws, checks
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

// frameOf is the frame an example states, checked against its bytes.
func (x example) frameOf(t *testing.T) frame.Frame {
	t.Helper()
	num := func(k string) uint64 {
		n, err := strconv.ParseUint(x.fields[k], 0, 64)
		if err != nil {
			t.Fatalf("%s:%d: field %s: %v", protocolDoc, x.line, k, err)
		}
		return n
	}
	var op frame.Op
	for o := frame.OpHello; o <= frame.OpShm; o++ {
		if o.String() == x.fields["op"] {
			op = o
		}
	}
	p := []byte(x.fields["payload"])
	if h, ok := strings.CutPrefix(x.fields["payload"], "hex:"); ok {
		var err error
		if p, err = hex.DecodeString(h); err != nil {
			t.Fatalf("%s:%d: payload: %v", protocolDoc, x.line, err)
		}
	}
	f := frame.Frame{Op: op, Flags: uint16(num("flags")), Req: uint32(num("req")), Handle: uint32(num("handle")),
		Arg: uint32(num("arg")), Arg2: num("arg2"), Payload: p}
	if b, _ := frame.Append(nil, &f); !bytes.Equal(b, x.raw) {
		t.Fatalf("%s:%d: the fields encode to %x, the block shows %x", protocolDoc, x.line, b, x.raw)
	}
	return f
}

// sameFrame compares a frame the agent sent with an example's: every
// field, but an Error's payload is only required to be there.
func sameFrame(got, want frame.Frame) bool {
	if got.Op != want.Op || got.Flags != want.Flags || got.Req != want.Req || got.Handle != want.Handle ||
		got.Arg != want.Arg || got.Arg2 != want.Arg2 {
		return false
	}
	if want.Op == frame.OpError {
		return len(got.Payload) > 0
	}
	return bytes.Equal(got.Payload, want.Payload)
}

// TestCaseNames: every case is named, once.
func TestCaseNames(t *testing.T) {
	var names []string
	for _, c := range cases {
		if c.name == "" || c.run == nil {
			t.Errorf("rule %s: a case without a name or a body", c.rule)
		}
		names = append(names, c.rule+" "+c.name)
	}
	slices.Sort(names)
	if d := slices.Compact(slices.Clone(names)); len(d) != len(names) {
		t.Error("two cases have the same rule and name")
	}
}
