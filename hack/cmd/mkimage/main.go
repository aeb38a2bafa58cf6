// Command mkimage builds the RDMAvisor container image without a Docker
// engine: it lays the static binaries built by hack/images.sh, and the files
// of hack/image/, into one layer on an empty base (what the Dockerfile's
// final stage holds) and writes a docker-archive tarball with a tag, which
// `ctr -n k8s.io images import` and `docker load` accept. With -verify it
// reads such a tarball back and checks it.
//
//	mkimage -bin-dir _output/bin -tag local.test/rdmavisor:dev -out _output/rdmavisor.tar
//	mkimage -verify _output/rdmavisor.tar -tag local.test/rdmavisor:dev
//
// -single builds an application image instead: one program as its
// entrypoint, and with -add the build host's files it needs, such as an
// interpreter with its libraries (app.go); -verify-app checks one.
//
//	mkimage -single echo.py -add /usr/bin/python3 -add /usr/lib/python3.11 -prune __pycache__ -tag t -out echo-py.tar
//	mkimage -verify-app echo-py.tar -tag t
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Binaries are the commands the image holds, in binDir; every one is
// required. The operator's DaemonSets run node-agent, device-plugin,
// dra-driver and rdmavisor-cni by name, so binDir is on PATH.
var Binaries = []string{"operator", "node-agent", "device-plugin", "dra-driver", "rdmavisor-cni", "rdmavisor"}

const (
	binDir = "/usr/local/bin"
	// User is the image's default user. Root, because the node agent and
	// the device plugin write host paths owned by root (the kubelet's
	// device-plugin and pod-resources directories, /opt/cni/bin,
	// /etc/cni/net.d) and the agent DaemonSet sets no user. The chart runs
	// the operator as NonRootUser instead.
	User = "0:0"
	// NonRootUser is the "nonroot" entry of hack/image/passwd.
	NonRootUser = 65532
)

// Entrypoint is the image's entrypoint: the user CLI. Kubernetes
// manifests name the binary they run in `command`, which replaces it.
var Entrypoint = []string{binDir + "/rdmavisor"}

// Options say what to build.
type Options struct {
	BinDir  string    // holds the static binaries named in Binaries
	RootFS  string    // holds passwd and group, copied to /etc
	Arch    string    // GOARCH of the binaries
	Version string    // org.opencontainers.image.version
	Created time.Time // every timestamp in the image, for reproducible builds
	// HostFiles are files of the build host copied to the same paths
	// (symlinks as symlinks, with their targets): what the ibverbs node
	// agent loads (IBVerbsFiles).
	HostFiles []string
	// Adds are trees of the build host an application image (-single)
	// holds, with what their ELF files load; names matching a Prune
	// pattern (path.Match, on base names) are left out.
	Adds  []Add
	Prune []string
}

// Build returns the image.
func Build(o Options) (v1.Image, error) {
	layer, err := rootLayer(o)
	if err != nil {
		return nil, err
	}
	cfg := &v1.ConfigFile{
		Architecture: o.Arch,
		OS:           "linux",
		Created:      v1.Time{Time: o.Created},
		Config: v1.Config{
			Entrypoint: Entrypoint,
			Env:        []string{"PATH=" + binDir + ":/usr/bin:/bin"},
			User:       User,
			WorkingDir: "/",
			Labels: map[string]string{
				"org.opencontainers.image.title":   "rdmavisor",
				"org.opencontainers.image.source":  "https://github.com/rdmavisor/rdmavisor",
				"org.opencontainers.image.version": o.Version,
			},
		},
	}
	return assemble(cfg, layer, v1.History{Created: v1.Time{Time: o.Created}, CreatedBy: "hack/cmd/mkimage",
		Comment: "RDMAvisor binaries and /etc/passwd"})
}

// assemble makes the image of one layer with configuration cfg.
func assemble(cfg *v1.ConfigFile, layer v1.Layer, h v1.History) (v1.Image, error) {
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	img, err = mutate.Append(img, mutate.Addendum{Layer: layer, History: h})
	if err != nil {
		return nil, fmt.Errorf("appending the layer: %w", err)
	}
	return img, nil
}

// layerWriter builds a layer as a tar, every entry with the same time.
type layerWriter struct {
	buf     bytes.Buffer
	tw      *tar.Writer
	created time.Time
}

func newLayerWriter(created time.Time) *layerWriter {
	w := &layerWriter{created: created}
	w.tw = tar.NewWriter(&w.buf)
	return w
}

func (w *layerWriter) dir(p string, mode int64, uid int) error {
	return w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: p + "/", Mode: mode,
		Uid: uid, Gid: uid, ModTime: w.created, Format: tar.FormatPAX})
}

func (w *layerWriter) file(p string, mode int64, data []byte) error {
	if err := w.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: p, Mode: mode,
		Size: int64(len(data)), ModTime: w.created, Format: tar.FormatPAX}); err != nil {
		return err
	}
	_, err := w.tw.Write(data)
	return err
}

// layer ends the tar and returns it as a layer.
func (w *layerWriter) layer() (v1.Layer, error) {
	if err := w.tw.Close(); err != nil {
		return nil, err
	}
	data := w.buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(data)), nil
	})
}

// rootLayer is the image's only layer, as a tar of its whole file system.
func rootLayer(o Options) (v1.Layer, error) {
	w := newLayerWriter(o.Created)
	for _, d := range []struct {
		path string
		mode int64
		uid  int
	}{
		{"etc", 0o755, 0}, {"home", 0o755, 0}, {"home/nonroot", 0o700, NonRootUser},
		{"root", 0o700, 0}, {"tmp", 0o1777, 0}, {"usr", 0o755, 0}, {"usr/local", 0o755, 0},
		{"usr/local/bin", 0o755, 0},
	} {
		if err := w.dir(d.path, d.mode, d.uid); err != nil {
			return nil, err
		}
	}
	for _, f := range []string{"passwd", "group"} {
		data, err := os.ReadFile(filepath.Join(o.RootFS, f))
		if err != nil {
			return nil, err
		}
		if err := w.file("etc/"+f, 0o644, data); err != nil {
			return nil, err
		}
	}
	for _, b := range Binaries {
		data, err := os.ReadFile(filepath.Join(o.BinDir, b))
		if err != nil {
			return nil, fmt.Errorf("reading binary %s: %w", b, err)
		}
		if err := w.file(strings.TrimPrefix(binDir, "/")+"/"+b, 0o755, data); err != nil {
			return nil, err
		}
	}
	done := map[string]bool{"etc": true, "home": true, "root": true, "tmp": true, "usr": true, "usr/local": true, "usr/local/bin": true}
	for _, f := range o.HostFiles {
		if err := w.hostFile(f, done); err != nil {
			return nil, fmt.Errorf("copying %s from this host: %w", f, err)
		}
	}
	return w.layer()
}

// BuildSingle returns an image of one static binary, /NAME, its entrypoint,
// run as NonRootUser: the example applications and the local cluster's
// pause image. With o.Adds, /NAME may be a script whose interpreter they
// bring (addTrees).
func BuildSingle(bin string, o Options) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading binary: %w", err)
	}
	name := filepath.Base(bin)
	w := newLayerWriter(o.Created)
	if err := w.dir("tmp", 0o1777, 0); err != nil {
		return nil, err
	}
	if err := w.file(name, 0o755, data); err != nil {
		return nil, err
	}
	if err := w.addTrees(o.Adds, o.Prune, o.Arch, map[string]bool{"tmp": true, name: true}); err != nil {
		return nil, err
	}
	layer, err := w.layer()
	if err != nil {
		return nil, err
	}
	return assemble(&v1.ConfigFile{
		Architecture: o.Arch, OS: "linux", Created: v1.Time{Time: o.Created},
		Config: v1.Config{Entrypoint: []string{"/" + name}, User: strconv.Itoa(NonRootUser) + ":" + strconv.Itoa(NonRootUser), WorkingDir: "/",
			Labels: map[string]string{"org.opencontainers.image.version": o.Version}},
	}, layer, v1.History{Created: v1.Time{Time: o.Created}, CreatedBy: "hack/cmd/mkimage -single"})
}

// Write writes img as a docker-archive tarball at out, tagged tag.
func Write(img v1.Image, tag, out string) error {
	t, err := name.NewTag(tag)
	if err != nil {
		return fmt.Errorf("parsing tag %q: %w", tag, err)
	}
	tmp := out + ".tmp"
	if err := tarball.WriteToFile(tmp, t, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return os.Rename(tmp, out)
}

// File is one regular file or directory of an image's file system.
type File struct {
	Mode     int64
	Uid, Gid int
	Size     int64
	Dir      bool
	Link     string // a symlink's target
	Data     []byte // a regular file's contents
}

// Read reads the image tagged tag back from the tarball at path, with its
// flattened file system.
func Read(path, tag string) (*v1.ConfigFile, map[string]File, error) {
	t, err := name.NewTag(tag)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing tag %q: %w", tag, err)
	}
	img, err := tarball.ImageFromPath(path, &t)
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", path, err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, nil, err
	}
	rc := mutate.Extract(img)
	defer rc.Close()
	files := map[string]File{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("reading the file system of %s: %w", path, err)
		}
		f := File{Mode: h.Mode, Uid: h.Uid, Gid: h.Gid, Size: h.Size, Dir: h.Typeflag == tar.TypeDir}
		switch h.Typeflag {
		case tar.TypeSymlink:
			f.Link = h.Linkname
		case tar.TypeReg:
			if f.Data, err = io.ReadAll(tr); err != nil {
				return nil, nil, fmt.Errorf("reading %s in %s: %w", h.Name, path, err)
			}
		}
		files["/"+strings.TrimSuffix(cleanPath(h.Name), "/")] = f
	}
	return cfg, files, nil
}

func cleanPath(p string) string { return path.Clean(strings.TrimPrefix(p, "./")) }

// Verify checks the image tagged tag in the tarball at path: its entrypoint,
// user, PATH and the binaries.
func Verify(path, tag string) error {
	cfg, files, err := Read(path, tag)
	if err != nil {
		return err
	}
	var errs []error
	if !slices.Equal(cfg.Config.Entrypoint, Entrypoint) {
		errs = append(errs, fmt.Errorf("entrypoint %q, want %q", cfg.Config.Entrypoint, Entrypoint))
	}
	if cfg.Config.User != User {
		errs = append(errs, fmt.Errorf("user %q, want %q", cfg.Config.User, User))
	}
	if !slices.Contains(cfg.Config.Env, "PATH="+binDir+":/usr/bin:/bin") {
		errs = append(errs, fmt.Errorf("env %q: want PATH with %s", cfg.Config.Env, binDir))
	}
	if cfg.OS != "linux" {
		errs = append(errs, fmt.Errorf("os %q, want linux", cfg.OS))
	}
	for _, b := range append(slices.Clone(Binaries), "/etc/passwd", "/etc/group", "/tmp") {
		p := b
		if !strings.HasPrefix(b, "/") {
			p = binDir + "/" + b
		}
		f, ok := files[p]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("%s is missing", p))
		case !f.Dir && strings.HasPrefix(p, binDir) && (f.Mode&0o111 == 0 || f.Size == 0):
			errs = append(errs, fmt.Errorf("%s is not an executable file (mode %o, %d bytes)", p, f.Mode, f.Size))
		}
	}
	errs = append(errs, verifyIBVerbs(files, cfg.Architecture)...)
	return errors.Join(errs...)
}

func main() {
	var (
		o       Options
		tag     string
		out     string
		verify  string
		single  string
		ibverbs bool
		// listIBVerbs names an agent whose files to list.
		listIBVerbs string
		verifyApp   string
	)
	flag.StringVar(&o.BinDir, "bin-dir", "_output/bin", "Directory of the static binaries: "+strings.Join(Binaries, ", ")+".")
	flag.StringVar(&o.RootFS, "rootfs", "hack/image", "Directory of passwd and group.")
	flag.StringVar(&o.Arch, "arch", runtime.GOARCH, "GOARCH the binaries were built for.")
	flag.StringVar(&o.Version, "version", "dev", "Version label of the image.")
	flag.StringVar(&tag, "tag", "local.test/rdmavisor:dev", "Image reference to tag the image with.")
	flag.StringVar(&out, "out", "_output/rdmavisor.tar", "docker-archive tarball to write.")
	flag.StringVar(&verify, "verify", "", "Read this tarball back and check the image tagged -tag instead of building.")
	flag.StringVar(&single, "single", "", "Build an image of this one static binary instead (entrypoint /NAME, non-root).")
	flag.BoolVar(&ibverbs, "ibverbs", false, "The node-agent in -bin-dir is built with cgo and -tags ibverbs: add what it loads (libibverbs, the rdma-core providers, "+driverDir+") from this host.")
	flag.StringVar(&listIBVerbs, "ibverbs-files", "", "Print the files of this host the ibverbs node agent at this path loads, one a line, and exit (the Dockerfile copies them).")
	flag.Func("add", "With -single: add this host file or directory tree, SRC (at the same path) or SRC=/DST, with the shared libraries its ELF files load (repeatable).", func(s string) error {
		a, err := ParseAdd(s)
		o.Adds = append(o.Adds, a)
		return err
	})
	flag.Func("prune", "With -add: leave out files and directories whose name matches this pattern (path.Match; repeatable).", func(s string) error {
		if _, err := path.Match(s, ""); err != nil {
			return fmt.Errorf("pattern %q: %w", s, err)
		}
		o.Prune = append(o.Prune, s)
		return nil
	})
	flag.StringVar(&verifyApp, "verify-app", "", "Read this tarball back and check the -single image tagged -tag: its entrypoint (and a script's interpreter) is there, and every ELF file finds its libraries.")
	flag.Parse()
	if verifyApp != "" {
		if err := VerifyApp(verifyApp, tag); err != nil {
			fmt.Fprintf(os.Stderr, "mkimage: %s: %v\n", verifyApp, err)
			os.Exit(1)
		}
		fmt.Printf("%s: %s runs and finds all it loads\n", verifyApp, tag)
		return
	}
	if len(o.Adds) > 0 && single == "" {
		fmt.Fprintln(os.Stderr, "mkimage: -add needs -single")
		os.Exit(2)
	}
	if listIBVerbs != "" {
		files, err := IBVerbsFiles(listIBVerbs, o.Arch)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
		fmt.Println(strings.Join(files, "\n"))
		return
	}
	if ibverbs && single == "" && verify == "" {
		files, err := IBVerbsFiles(filepath.Join(o.BinDir, IBVerbsAgent), o.Arch)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mkimage:", err)
			os.Exit(1)
		}
		o.HostFiles = files
	}
	if err := run(o, tag, out, verify, single); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(o Options, tag, out, verify, single string) error {
	if verify != "" {
		if err := Verify(verify, tag); err != nil {
			return fmt.Errorf("%s: %w", verify, err)
		}
		fmt.Printf("%s: %s is a valid RDMAvisor image\n", verify, tag)
		return nil
	}
	// SOURCE_DATE_EPOCH (reproducible-builds.org) fixes the timestamps;
	// without it they are the Unix epoch, so equal inputs give equal images.
	o.Created = time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
		}
		o.Created = time.Unix(sec, 0).UTC()
	}
	build := func() (v1.Image, error) { return Build(o) }
	if single != "" {
		build = func() (v1.Image, error) { return BuildSingle(single, o) }
	}
	img, err := build()
	if err != nil {
		return err
	}
	if err := Write(img, tag, out); err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s: %s (%s)\n", out, tag, d)
	return nil
}
