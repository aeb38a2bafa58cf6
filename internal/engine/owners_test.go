package engine

import (
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// owners says which files may touch the fields of each type that owns a
// part of a vconn's state (see VConn): the owner's methods are beside
// its state, and everyone else goes through them.
var owners = map[string][]string{
	"sender":     {"send.go"},  // the sender's queue
	"reader":     {"recv.go"},  // the reader's queue
	"reassembly": {"recv.go"},  // the receiving poller's message under way
	"served":     {"serve.go"}, // the serving poller's
	"autoLink":   {"auto.go"},  // Auto's reliability
}

// TestOwners fails when a file of the package (tests aside) touches a
// field of an owner type that is not its owner's.
func TestOwners(t *testing.T) {
	fset, files := parsePackage(t)
	for _, v := range ownerViolations(t, fset, files) {
		t.Error(v)
	}
}

// TestOwnersCatches: the check finds a field touched from a file that
// does not own it, and says where.
func TestOwnersCatches(t *testing.T) {
	fset, files := parsePackage(t)
	const src = "package engine\n\nfunc planted(vc *VConn) uint32 { return vc.snd.seq + uint32(len(vc.rcv.q)) }\n"
	f, err := parser.ParseFile(fset, "planted.go", src, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := ownerViolations(t, fset, append(files, f))
	want := []string{
		"planted.go:3:48: touches sender.seq, which only send.go may",
		"planted.go:3:72: touches reader.q, which only recv.go may",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// parsePackage parses the package's files, tests aside.
func parsePackage(t *testing.T) (*token.FileSet, []*ast.File) {
	t.Helper()
	names, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, f)
	}
	return fset, files
}

// ownerViolations type-checks files and lists, sorted, every selector
// of an owner type's field outside its owner's files.
func ownerViolations(t *testing.T, fset *token.FileSet, files []*ast.File) []string {
	t.Helper()
	info := &types.Info{Selections: map[*ast.SelectorExpr]*types.Selection{}}
	conf := types.Config{Importer: importer.ForCompiler(fset, "source", nil)}
	if _, err := conf.Check("github.com/rdmavisor/rdmavisor/internal/engine", fset, files, info); err != nil {
		t.Fatalf("type-checking the package: %v", err)
	}
	var out []string
	for sel, s := range info.Selections {
		if s.Kind() != types.FieldVal {
			continue
		}
		recv := s.Recv()
		if p, ok := recv.(*types.Pointer); ok {
			recv = p.Elem()
		}
		named, ok := recv.(*types.Named)
		if !ok {
			continue
		}
		allowed, owned := owners[named.Obj().Name()]
		if !owned {
			continue
		}
		pos := fset.Position(sel.Sel.Pos())
		file := filepath.Base(pos.Filename)
		if !slices.Contains(allowed, file) {
			out = append(out, fmt.Sprintf("%s:%d:%d: touches %s.%s, which only %s may",
				file, pos.Line, pos.Column, named.Obj().Name(), sel.Sel.Name, strings.Join(allowed, ", ")))
		}
	}
	sort.Strings(out)
	return out
}
