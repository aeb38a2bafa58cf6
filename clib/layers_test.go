package clib_test

import (
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestCLayers: libvconn's files call one way, down the layers
// src/internal.h draws: no file calls into one that calls back into it,
// directly or round a longer circle. nm says which file defines each
// symbol another file's object leaves undefined.
func TestCLayers(t *testing.T) {
	objs, _ := filepath.Glob(filepath.Join(build(t), "lib", "*.o"))
	if len(objs) < 2 {
		t.Fatalf("the library's objects: %v", objs)
	}
	defs := map[string]string{} // symbol: the file that defines it
	undef := map[string][]string{}
	for _, o := range objs {
		file := strings.TrimSuffix(filepath.Base(o), ".o") + ".c"
		out, err := exec.Command("nm", o).Output()
		if err != nil {
			t.Fatalf("nm %s: %v", o, err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			f := strings.Fields(l)
			switch {
			case len(f) == 2 && f[0] == "U":
				undef[file] = append(undef[file], f[1])
			case len(f) == 3 && strings.Contains("TDBR", f[1]):
				defs[f[2]] = file
			}
		}
	}
	calls := map[string][]string{}
	for file, syms := range undef {
		seen := map[string]bool{}
		for _, s := range syms {
			if d, ok := defs[s]; ok && d != file && !seen[d] {
				seen[d] = true
				calls[file] = append(calls[file], d)
			}
		}
		sort.Strings(calls[file])
	}
	files := make([]string, 0, len(calls))
	for f := range calls {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		t.Logf("%s -> %s", f, strings.Join(calls[f], " "))
	}
	if c := circle(files, calls); c != nil {
		t.Fatalf("the files call round a circle: %s", strings.Join(c, " -> "))
	}
}

// circle finds a circle in the graph: its files, the first again at the
// end; nil when there is none.
func circle(files []string, calls map[string][]string) []string {
	const (
		unseen = iota
		open
		done
	)
	state := map[string]int{}
	var path []string
	var visit func(f string) []string
	visit = func(f string) []string {
		state[f] = open
		path = append(path, f)
		for _, g := range calls[f] {
			switch state[g] {
			case open:
				for i, p := range path {
					if p == g {
						return append(append([]string(nil), path[i:]...), g)
					}
				}
			case unseen:
				if c := visit(g); c != nil {
					return c
				}
			}
		}
		path = path[:len(path)-1]
		state[f] = done
		return nil
	}
	for _, f := range files {
		if state[f] == unseen {
			if c := visit(f); c != nil {
				return c
			}
		}
	}
	return nil
}
