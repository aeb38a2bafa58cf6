// Package docs holds the repository's user documents; its test holds the
// troubleshooting guide to the code it quotes.
package docs

import (
	"bufio"
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// troubleshootingDoc is the guide whose "What you see" quotes must be the
// code's own text (its HTML comment states the convention).
const troubleshootingDoc = "troubleshooting.md"

// seenMarker opens a paragraph of quoted messages.
const seenMarker = "**What you see:**"

// wildcard stands, in a quote, for what the code fills in.
const wildcard = "…"

var codeSpan = regexp.MustCompile("`([^`]+)`")

// literalBreak is a string literal continued on the next line: C's
// adjacent literals, Go's + and Python's implicit concatenation (of an
// f-string too). Joining them gives the message as a user sees it.
var literalBreak = regexp.MustCompile(`"[ \t]*\+?[ \t]*\n[ \t]*f?"`)

// quote is one message the guide says a user sees.
type quote struct {
	line int
	text string
}

// seenQuotes returns the backticked spans of every "What you see"
// paragraph (from the marker to the next blank line) and of every cell of
// a table column whose header starts with "What you see".
func seenQuotes(t *testing.T, doc []byte) (quotes []quote, markers int) {
	t.Helper()
	var (
		inPara    bool
		inTable   bool
		seenCols  map[int]bool
		paraStart int
		paraSpans int
	)
	endPara := func() {
		if inPara && paraSpans == 0 {
			t.Errorf("%s:%d: a %s paragraph quotes nothing", troubleshootingDoc, paraStart, seenMarker)
		}
		inPara = false
	}
	inComment := false
	sc := bufio.NewScanner(bytes.NewReader(doc))
	for n := 1; sc.Scan(); n++ {
		l := sc.Text()
		trimmed := strings.TrimSpace(l)
		// HTML comments (the convention's own statement) quote nothing.
		if strings.HasPrefix(trimmed, "<!--") {
			inComment = true
		}
		if inComment {
			inComment = !strings.Contains(trimmed, "-->")
			continue
		}
		if trimmed == "" {
			endPara()
			inTable = false
			continue
		}
		if strings.HasPrefix(trimmed, "|") {
			cells := splitRow(trimmed)
			switch {
			case !inTable:
				inTable, seenCols = true, map[int]bool{}
				for i, c := range cells {
					if strings.HasPrefix(c, "What you see") {
						seenCols[i] = true
						markers++
					}
				}
			case strings.Trim(trimmed, "|-: ") == "":
				// The delimiter row.
			default:
				for i, c := range cells {
					if !seenCols[i] {
						continue
					}
					for _, m := range codeSpan.FindAllStringSubmatch(c, -1) {
						quotes = append(quotes, quote{n, m[1]})
					}
				}
			}
			continue
		}
		inTable = false
		rest := l
		if i := strings.Index(l, seenMarker); i >= 0 {
			endPara()
			inPara, paraStart, paraSpans = true, n, 0
			markers++
			rest = l[i+len(seenMarker):]
		}
		if inPara {
			for _, m := range codeSpan.FindAllStringSubmatch(rest, -1) {
				quotes = append(quotes, quote{n, m[1]})
				paraSpans++
			}
		}
	}
	endPara()
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return quotes, markers
}

// splitRow splits a Markdown table row into its cells (no cell here holds
// an escaped pipe).
func splitRow(row string) []string {
	cells := strings.Split(strings.Trim(row, "|"), "|")
	for i := range cells {
		cells[i] = strings.TrimSpace(cells[i])
	}
	return cells
}

// sources reads the repository's non-test source: Go, C and Python, outside
// test files, test directories and testdata.
func sources(t *testing.T, root string) map[string]string {
	t.Helper()
	skipDir := map[string]bool{".git": true, "testdata": true, "tests": true, "docs": true, "bench": true}
	out := map[string]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			// test/ holds the suites, clib/test the C tests, hack the
			// tools of the build and the tests.
			if skipDir[d.Name()] || rel == "test" || rel == "hack" || rel == filepath.Join("clib", "test") || (path != root && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			return nil
		}
		name := d.Name()
		switch filepath.Ext(name) {
		case ".go":
			if strings.HasSuffix(name, "_test.go") {
				return nil
			}
		case ".c", ".h":
		case ".py":
			if strings.HasPrefix(name, "test_") || name == "conftest.py" {
				return nil
			}
		default:
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		out[rel] = literalBreak.ReplaceAllString(string(b), "")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) == 0 {
		t.Fatalf("no source files under %s", root)
	}
	return out
}

// pieces splits a quote at its wildcards; the pieces must occur in order.
func pieces(q string) []string {
	var out []string
	for _, p := range strings.Split(q, wildcard) {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// inOrder reports whether every piece occurs in s, each after the last.
func inOrder(s string, ps []string) bool {
	for _, p := range ps {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}

// TestTroubleshootingQuotesCode holds docs/troubleshooting.md to the code:
// every message it quotes as what a user sees occurs in the repository's
// non-test Go, C or Python source (around its … wildcards, in order, in
// one file), so that a changed message fails here until the guide
// follows it.
func TestTroubleshootingQuotesCode(t *testing.T) {
	doc, err := os.ReadFile(troubleshootingDoc)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(doc, []byte(seenMarker)) {
		t.Fatalf("%s has no %s marker", troubleshootingDoc, seenMarker)
	}
	quotes, markers := seenQuotes(t, doc)
	if len(quotes) < 100 {
		t.Fatalf("%s quotes %d messages under %d markers: the parser lost them", troubleshootingDoc, len(quotes), markers)
	}
	src := sources(t, "..")
	checked := map[string]bool{}
	for _, q := range quotes {
		if checked[q.text] {
			continue
		}
		checked[q.text] = true
		ps := pieces(q.text)
		if len(ps) == 0 {
			t.Errorf("%s:%d: %q quotes nothing but wildcards", troubleshootingDoc, q.line, q.text)
			continue
		}
		found := false
		for _, s := range src {
			if inOrder(s, ps) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s:%d: %q occurs in no non-test source file", troubleshootingDoc, q.line, q.text)
		}
	}
	t.Logf("%d quotes (%d distinct) under %d markers, checked against %d source files", len(quotes), len(checked), markers, len(src))
}
