package main

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseAdd(t *testing.T) {
	for in, want := range map[string]Add{
		"/usr/bin/python3":            {Src: "/usr/bin/python3"},
		"/usr/lib/python3.11/":        {Src: "/usr/lib/python3.11"},
		"python/rdmavisor=/usr/lib/x": {Src: "python/rdmavisor", Dst: "/usr/lib/x"},
		"a=/b/../c/":                  {Src: "a", Dst: "/c"},
	} {
		got, err := ParseAdd(in)
		if err != nil || got != want {
			t.Errorf("ParseAdd(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"":          "no source path",
		"=/x":       "no source path",
		"python":    "must be absolute",
		"a=b":       "must be absolute",
		"a=/":       "must be absolute, below /",
		"a=/..":     "must be absolute, below /",
		"/a\x00b":   "NUL",
		"/a=/b\x00": "NUL",
		"relative=": "must be absolute",
	} {
		if _, err := ParseAdd(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseAdd(%q): %v; want %q", in, err, want)
		}
	}
}

func FuzzParseAdd(f *testing.F) {
	for _, s := range []string{"/usr/bin/python3", "a=/b", "a=b", "=", "/x=/y=/z", "a=/../..", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseAdd(s)
		if err != nil {
			return
		}
		if a.Src == "" || strings.ContainsRune(a.Src+a.Dst, 0) {
			t.Fatalf("ParseAdd(%q) = %+v", s, a)
		}
		if a.Dst == "" && !filepath.IsAbs(a.Src) || a.Dst != "" && (a.Dst != path.Clean(a.Dst) || !path.IsAbs(a.Dst) || a.Dst == "/") {
			t.Fatalf("ParseAdd(%q) = %+v: not an absolute image path", s, a)
		}
	})
}

// extract lays an image's files out under dir, as a container runtime
// would.
func extract(t *testing.T, files map[string]File, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(files))
	for p := range files {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		f, to := files[p], filepath.Join(dir, p)
		var err error
		switch {
		case f.Dir:
			err = os.MkdirAll(to, 0o755)
			if err == nil {
				err = os.Chmod(to, os.FileMode(f.Mode&0o777)|modeSticky(f.Mode))
			}
		case f.Link != "":
			err = os.Symlink(f.Link, to)
		default:
			err = os.WriteFile(to, f.Data, os.FileMode(f.Mode&0o777))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

func modeSticky(m int64) os.FileMode {
	if m&0o1000 != 0 {
		return os.ModeSticky
	}
	return 0
}

// TestAppImage builds the image of a Python program the way
// hack/images.sh builds examples/echo-py's: the script as the entrypoint,
// Debian's interpreter and its standard library (pruned) from this host,
// a package moved into dist-packages. VerifyApp finds all it loads, and
// the program runs in it, as the image's non-root user, from a chroot.
func TestAppImage(t *testing.T) {
	real, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		t.Fatalf("no /usr/bin/python3 (hack/deps.sh test installs it): %v", err)
	}
	stdlib := "/usr/lib/" + filepath.Base(real) // /usr/lib/python3.11
	tmp := t.TempDir()
	script := filepath.Join(tmp, "app.py")
	if err := os.WriteFile(script, []byte("#!/usr/bin/python3\nimport asyncio, json, os, ssl, sys, greet\nprint(json.dumps({'greeting': greet.HELLO, 'uid': os.getuid(), 'prefix': sys.prefix}))\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	pkg := filepath.Join(tmp, "greet")
	for p, s := range map[string]string{"__init__.py": "HELLO = 'hi'\n", "__pycache__/x.pyc": "stale", "tests/test_x.py": ""} {
		_ = os.MkdirAll(filepath.Dir(filepath.Join(pkg, p)), 0o755)
		if err := os.WriteFile(filepath.Join(pkg, p), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	o := Options{Arch: runtime.GOARCH, Version: "test", Created: time.Unix(0, 0).UTC(),
		Adds:  []Add{{Src: "/usr/bin/python3"}, {Src: stdlib}, {Src: pkg, Dst: "/usr/lib/python3/dist-packages/greet"}},
		Prune: []string{"__pycache__", "test", "tests", "idlelib", "tkinter", "turtledemo", "ensurepip", "config-3.*", "_test*"}}
	img, err := BuildSingle(script, o)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(tmp, "app.tar")
	if err := Write(img, "local.test/app:test", out); err != nil {
		t.Fatal(err)
	}
	if err := VerifyApp(out, "local.test/app:test"); err != nil {
		t.Fatalf("VerifyApp: %v", err)
	}
	cfg, files, err := Read(out, "local.test/app:test")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Config.Entrypoint[0] != "/app.py" {
		t.Fatalf("entrypoint %q", cfg.Config.Entrypoint)
	}
	for _, p := range []string{real, stdlib + "/os.py", stdlib + "/asyncio/__init__.py", "/usr/lib/python3/dist-packages/greet/__init__.py"} {
		if r := resolve(files, p); r == "" || files[r].Dir {
			t.Errorf("%s is not in the image", p)
		}
	}
	var size int64
	for p, f := range files {
		size += f.Size
		base := path.Base(p)
		if base == "__pycache__" || base == "tests" || base == "tkinter" || strings.HasPrefix(base, "_test") || strings.HasPrefix(base, "config-3.") {
			t.Errorf("%s was to be pruned", p)
		}
	}
	t.Logf("the image holds %d files, %.1f MiB", len(files), float64(size)/(1<<20))

	root := filepath.Join(tmp, "root")
	extract(t, files, root)
	cmd := exec.Command("/app.py")
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: NonRootUser, Gid: NonRootUser}}
	cmd.Dir, cmd.Env = "/", []string{}
	got, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(got)) != `{"greeting": "hi", "uid": 65532, "prefix": "/usr"}` {
		t.Fatalf("/app.py in the image: %v: %s", err, got)
	}

	// Without the interpreter's libraries and stdlib, VerifyApp names
	// what the program would miss; a #! naming nothing there fails too.
	bad := filepath.Join(tmp, "bad.py")
	if err := os.WriteFile(bad, []byte("#!/usr/bin/python9\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		entry string
		adds  []Add
		want  []string
	}{
		{bad, []Add{{Src: stdlib + "/os.py", Dst: "/lib/os.py"}}, []string{"interpreter /usr/bin/python9 is not an executable file"}},
		{real, nil, []string{"its interpreter", "needs libc.so.6, which is not in the image"}},
	} {
		o.Adds = c.adds
		img, err := BuildSingle(c.entry, o)
		if err != nil {
			t.Fatal(err)
		}
		if err := Write(img, "local.test/app:bad", out); err != nil {
			t.Fatal(err)
		}
		err = VerifyApp(out, "local.test/app:bad")
		for _, want := range c.want {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("VerifyApp of /%s: %v; want %q", filepath.Base(c.entry), err, want)
			}
		}
	}
}
