package main

import (
	"bytes"
	"encoding/xml"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// envServe makes the test binary the testagent: the pytest suite's
// fixture runs it so, which spares a second build of the agents.
const envServe = "RDMAVISOR_TESTAGENT_SERVE"

func TestMain(m *testing.M) {
	if os.Getenv(envServe) == "1" {
		fs := flag.NewFlagSet("testagent", flag.ExitOnError)
		transport := fs.String("transport", "rc", "the agents' vconn transport")
		verbose := fs.Bool("v", false, "log the agents' messages to stderr")
		_ = fs.Parse(os.Args[1:])
		if err := run(os.Stdin, os.Stdout, os.Stderr, *transport, *verbose); err != nil {
			fmt.Fprintln(os.Stderr, "testagent:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// python is the interpreter with Debian's pytest: /usr/bin/python3, which
// a python3 earlier on PATH (pyenv's) would shadow; $RDMAVISOR_PYTHON
// overrides.
func python(t *testing.T) string {
	if p := os.Getenv("RDMAVISOR_PYTHON"); p != "" {
		return p
	}
	if _, err := os.Stat("/usr/bin/python3"); err == nil {
		return "/usr/bin/python3"
	}
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is not installed: run hack/deps.sh test (Debian python3, python3-venv, python3-pytest)")
	}
	return p
}

func runCmd(t *testing.T, dir string, env []string, name string, args ...string) string {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// junit is what the test counts of pytest's --junitxml report.
type junit struct {
	Suites []struct {
		Tests    int `xml:"tests,attr"`
		Failures int `xml:"failures,attr"`
		Errors   int `xml:"errors,attr"`
		Skipped  int `xml:"skipped,attr"`
	} `xml:"testsuite"`
}

// TestPytest installs the Python package (python/) with pip into a
// virtual environment and runs its pytest suite against agents this test
// binary serves (TestMain). No test may be skipped.
func TestPytest(t *testing.T) {
	py := python(t)
	if out, err := exec.Command(py, "-c", "import pytest, venv").CombinedOutput(); err != nil {
		t.Fatalf("%s cannot import pytest and venv (run hack/deps.sh test: Debian python3-pytest, python3-venv): %v\n%s", py, err, out)
	}
	repo, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	// A copy: what pip and Python write next to the sources stays out of
	// the repository.
	src := filepath.Join(tmp, "src")
	if err := copyTree(filepath.Join(repo, "python"), src); err != nil {
		t.Fatal(err)
	}
	venv := filepath.Join(tmp, "venv")
	runCmd(t, tmp, nil, py, "-m", "venv", "--system-site-packages", venv)
	vpy := filepath.Join(venv, "bin", "python")
	runCmd(t, tmp, nil, vpy, "-m", "pip", "install", "--quiet", "--no-index", "--no-build-isolation", src)
	where := runCmd(t, tmp, nil, vpy, "-c", "import rdmavisor; print(rdmavisor.__file__)")
	if !strings.HasPrefix(strings.TrimSpace(where), venv) {
		t.Fatalf("rdmavisor imports from %s, not from the virtual environment %s", where, venv)
	}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(tmp, "junit.xml")
	cmd := exec.Command(vpy, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfEs", "--junitxml="+report,
		filepath.Join(repo, "python", "tests"))
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), envServe+"=1", "RDMAVISOR_TESTAGENT="+self,
		"RDMAVISOR_PYTEST_INSTALLED=1", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	t.Logf("pytest:\n%s", out)
	if err != nil {
		t.Fatalf("pytest: %v", err)
	}
	b, err := os.ReadFile(report)
	if err != nil {
		t.Fatal(err)
	}
	var j junit
	if err := xml.NewDecoder(bytes.NewReader(b)).Decode(&j); err != nil || len(j.Suites) == 0 {
		t.Fatalf("pytest's report %s: %v\n%s", report, err, b)
	}
	s := j.Suites[0]
	if s.Tests == 0 || s.Failures+s.Errors+s.Skipped != 0 {
		t.Fatalf("pytest ran %d tests: %d failed, %d errors, %d skipped; want all to pass, none skipped", s.Tests, s.Failures, s.Errors, s.Skipped)
	}
}

// copyTree copies the regular files under from to to, less Python's caches.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, p)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		switch {
		case d.IsDir() && d.Name() == "__pycache__":
			return filepath.SkipDir
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		case !d.Type().IsRegular():
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}
