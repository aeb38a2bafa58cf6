package cni

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sys/unix"

	"github.com/rdmavisor/rdmavisor/internal/atomicfile"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// StateFile, in the CNI configuration directory, remembers what Install
// changed so that Uninstall can restore it. Its name has none of the
// extensions runtimes load (.conf, .conflist, .json).
const StateFile = ".rdmavisor-cni.state"

// ConfExtensions are the extensions of the files runtimes load from the
// CNI configuration directory (containerd and CRI-O through libcni).
var ConfExtensions = []string{".conf", ".conflist", ".json"}

// ErrNoConfig: the configuration directory holds no CNI configuration yet
// (the primary CNI has not installed its own).
var ErrNoConfig = errors.New("no CNI configuration")

// Installer chains the plugin into the node's primary CNI configuration:
// the lexicographically first .conf, .conflist or .json file of ConfDir,
// the one the runtime uses.
//
// A conflist gets the plugin's entry appended to its plugins. A single
// configuration (.conf, or a .json without "plugins") is converted, as
// Istio's installer does, into a conflist with the same base name whose
// first plugin is the original configuration, and the original file is
// removed; the conversion is refused if that name is taken or would not
// sort first. A file the installer does not understand (not strict JSON,
// duplicate keys, no name, a plugin without a type, a CNI version the
// plugin does not speak, a symlink) is refused and left alone.
//
// Install is idempotent: run again, it changes nothing, or updates the
// entry in place when the configuration changed. Every file is written
// atomically (a temporary file in the same directory, renamed). Uninstall
// restores the original file byte for byte when the configuration is still
// as Install left it; if something else rewrote it since, only the
// plugin's entries are removed.
type Installer struct {
	ConfDir string
	// BinDir receives the binary as BinDir/rdmavisor-cni.
	BinDir string
	// Binary is the plugin binary to copy; empty: none is copied.
	Binary string
	// Entry is the plugin's conflist entry.
	Entry Entry
	Log   logr.Logger
}

// state is what StateFile holds.
type state struct {
	Version int `json:"version"`
	// File is the configuration the entry was inserted into.
	File string `json:"file"`
	// WrittenSHA256 is the hash of File as Install wrote it.
	WrittenSHA256 string `json:"writtenSHA256"`
	// Original is the configuration before Install, when it held no entry
	// of the plugin: restored byte for byte by Uninstall.
	Original *originalFile `json:"original,omitempty"`
}

type originalFile struct {
	File  string      `json:"file"`
	Mode  fs.FileMode `json:"mode"`
	Bytes []byte      `json:"bytes"`
}

const stateVersion = 1

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// EntryFor returns the entry that points the plugin at the agent of cfg.
// The agent mounts only cfg.SocketDir from the host, where the plugin runs,
// so the admin socket must be inside it.
func EntryFor(cfg *config.AgentConfig, policy Policy) (Entry, error) {
	if policy != FailOpen && policy != FailClosed {
		return Entry{}, fmt.Errorf("failure policy must be %q or %q, got %q", FailOpen, FailClosed, policy)
	}
	rel, err := filepath.Rel(cfg.SocketDir, cfg.AdminSocket)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return Entry{}, fmt.Errorf("the admin socket %s is not inside socketDir %s, the only agent directory shared with the host: the CNI plugin, which runs on the host, could not reach it", cfg.AdminSocket, cfg.SocketDir)
	}
	if err := checkSocketPath(cfg.AdminSocket); err != nil {
		return Entry{}, fmt.Errorf("admin socket: %w", err)
	}
	return Entry{Type: PluginType, AdminSocket: cfg.AdminSocket, FailurePolicy: policy}, nil
}

// primary returns the name of the configuration the runtime uses, or
// ErrNoConfig.
func primary(dir string) (string, error) {
	files, err := confFiles(dir)
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("%w in %s: the primary CNI plugin must be installed first", ErrNoConfig, dir)
	}
	return files[0], nil
}

// confFiles lists the names of dir's configuration files in the order
// runtimes sort them.
func confFiles(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir) // sorted by name
	if err != nil {
		return nil, fmt.Errorf("reading the CNI configuration directory: %w", err)
	}
	var names []string
	for _, e := range ents {
		if !e.IsDir() && slices.Contains(ConfExtensions, filepath.Ext(e.Name())) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}

// readConf reads a configuration file, refusing symlinks and other
// non-regular files, which an atomic rename would replace.
func readConf(path string) ([]byte, fs.FileMode, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, 0, err
	}
	if !fi.Mode().IsRegular() {
		return nil, 0, notUnderstood("%s is not a regular file (%v)", path, fi.Mode().Type())
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, err
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfBytes+1))
	return data, fi.Mode().Perm(), err
}

func (in *Installer) loadState() (*state, error) {
	b, err := os.ReadFile(filepath.Join(in.ConfDir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil || st.Version != stateVersion || st.File == "" || filepath.Base(st.File) != st.File ||
		(st.Original != nil && filepath.Base(st.Original.File) != st.Original.File) {
		return nil, fmt.Errorf("%s: not a state file of this installer (remove it to start afresh)", filepath.Join(in.ConfDir, StateFile))
	}
	return &st, nil
}

// lock serializes installers on the node (two agents' init containers):
// an exclusive flock on the configuration directory itself, so nothing is
// left behind. The returned func releases it.
func (in *Installer) lock() (func(), error) {
	d, err := os.Open(in.ConfDir)
	if err != nil {
		return nil, fmt.Errorf("opening the CNI configuration directory: %w", err)
	}
	if err := unix.Flock(int(d.Fd()), unix.LOCK_EX); err != nil {
		_ = d.Close()
		return nil, fmt.Errorf("locking %s: %w", in.ConfDir, err)
	}
	return func() { _ = d.Close() }, nil
}

// InstallWhenReady runs Install, retrying every poll while the directory
// holds no configuration yet (on a new node the primary CNI may start after
// the agent), until ctx ends.
func (in *Installer) InstallWhenReady(ctx context.Context, poll time.Duration) (string, error) {
	for {
		path, err := in.Install()
		if !errors.Is(err, ErrNoConfig) {
			return path, err
		}
		if ctx.Err() != nil {
			return "", err
		}
		in.Log.Info("Waiting for the primary CNI configuration", "dir", in.ConfDir)
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(poll):
		}
	}
}

// Keep holds an installation for as long as the agent runs on the node: it
// installs (waiting for the primary configuration as InstallWhenReady
// does), then checks every interval that the plugin is still chained and
// its binary still there, and installs again if not (a primary CNI that
// rewrites its file drops our entry). When ctx ends it uninstalls, so a
// node whose agent is removed is left as it was found, as Istio's CNI
// installer does. A pod killed without a graceful stop leaves the plugin
// installed, and its replacement finds it so.
func (in *Installer) Keep(ctx context.Context, interval time.Duration) error {
	if _, err := in.InstallWhenReady(ctx, interval); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before anything was installed
		}
		return err
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			in.Log.Info("Stopping: removing the plugin from the node")
			return in.Uninstall()
		case <-t.C:
		}
		if in.chained() {
			continue
		}
		in.Log.Info("The plugin is no longer installed: installing it again")
		if _, err := in.Install(); err != nil {
			// Keep trying: the primary CNI may be rewriting its file.
			in.Log.Error(err, "Reinstalling the plugin")
		}
	}
}

// chained reports whether the binary is in place and the primary
// configuration holds the plugin's entry.
func (in *Installer) chained() bool {
	if in.Binary != "" {
		if _, err := os.Stat(filepath.Join(in.BinDir, PluginType)); err != nil {
			return false
		}
	}
	name, err := primary(in.ConfDir)
	if err != nil {
		return false
	}
	data, _, err := readConf(filepath.Join(in.ConfDir, name))
	if err != nil {
		return false
	}
	c, err := parseConf(data)
	return err == nil && len(c.ours()) > 0
}

// Install copies the binary and chains the plugin into the primary
// configuration. It returns the configuration file it left the plugin in.
func (in *Installer) Install() (string, error) {
	unlock, err := in.lock()
	if err != nil {
		return "", err
	}
	defer unlock()
	return in.install()
}

func (in *Installer) install() (string, error) {
	if in.Entry.Type != PluginType {
		return "", fmt.Errorf("install: the entry's type must be %q, got %q", PluginType, in.Entry.Type)
	}
	entry, err := json.Marshal(in.Entry)
	if err != nil {
		return "", err
	}
	if in.Binary != "" {
		if err := in.copyBinary(); err != nil {
			return "", err
		}
	}
	st, err := in.loadState()
	if err != nil {
		return "", err
	}
	name, err := primary(in.ConfDir)
	if err != nil {
		return "", err
	}
	if st != nil && st.File != name {
		// Another file became the primary: restore the old one first.
		in.Log.Info("Removing the plugin from a configuration that is no longer the primary", "file", st.File, "primary", name)
		if err := in.restore(st); err != nil {
			return "", err
		}
		st = nil
	}
	path := filepath.Join(in.ConfDir, name)
	data, mode, err := readConf(path)
	if err != nil {
		return "", fmt.Errorf("install: %w", err)
	}
	c, err := parseConf(data)
	if err != nil {
		return "", fmt.Errorf("install: refusing to change %s: %w", path, err)
	}
	n, changed := c.withEntry(entry)
	if !changed {
		in.Log.V(1).Info("The plugin is already installed", "file", path)
		return path, nil
	}
	out, err := n.marshal()
	if err != nil {
		return "", err
	}
	target := name
	if c.single {
		target = strings.TrimSuffix(name, filepath.Ext(name)) + ".conflist"
		if err := in.checkConversion(name, target); err != nil {
			return "", err
		}
	}
	next := &state{Version: stateVersion, File: target, WrittenSHA256: sum(out)}
	switch {
	case st != nil && st.File == name && st.WrittenSHA256 == sum(data):
		next.Original = st.Original // updating our own entry
	case len(c.ours()) == 0:
		next.Original = &originalFile{File: name, Mode: mode, Bytes: data}
	}
	// The state first: if the configuration write is lost, Uninstall sees a
	// file that is not what it wrote and only removes the entry.
	if err := in.writeState(next); err != nil {
		return "", err
	}
	if err := atomicfile.Write(filepath.Join(in.ConfDir, target), out, mode); err != nil {
		return "", fmt.Errorf("install: %w", err)
	}
	if target != name {
		if err := os.Remove(path); err != nil {
			return "", fmt.Errorf("install: removing the converted %s: %w", path, err)
		}
	}
	in.Log.Info("Chained the plugin into the primary CNI configuration", "file", filepath.Join(in.ConfDir, target), "converted", c.single)
	return filepath.Join(in.ConfDir, target), nil
}

// checkConversion refuses to convert name into target when target exists
// or some other configuration would sort before it.
func (in *Installer) checkConversion(name, target string) error {
	if _, err := os.Lstat(filepath.Join(in.ConfDir, target)); err == nil {
		return fmt.Errorf("install: refusing to convert %s: %s exists", name, target)
	}
	files, err := confFiles(in.ConfDir)
	if err != nil {
		return err
	}
	for _, f := range files {
		if f != name && f < target {
			return fmt.Errorf("install: refusing to convert %s: %s would sort before %s and become the primary configuration", name, f, target)
		}
	}
	return nil
}

func (in *Installer) writeState(st *state) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(filepath.Join(in.ConfDir, StateFile), append(b, '\n'), 0o600)
}

// Uninstall removes the plugin from the node's CNI configuration and its
// binary from BinDir.
func (in *Installer) Uninstall() error {
	unlock, err := in.lock()
	if err != nil {
		return err
	}
	defer unlock()
	st, err := in.loadState()
	if err != nil {
		return err
	}
	if st != nil {
		err = in.restore(st)
	} else {
		err = in.removeEverywhere()
	}
	if err != nil {
		return err
	}
	bin := filepath.Join(in.BinDir, PluginType)
	if in.BinDir != "" {
		if err := os.Remove(bin); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("uninstall: %w", err)
		}
	}
	return nil
}

// restore undoes the install st records, then removes the state file.
func (in *Installer) restore(st *state) error {
	path := filepath.Join(in.ConfDir, st.File)
	data, mode, err := readConf(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		in.Log.Info("The configuration the plugin was installed in is gone", "file", path)
	case err != nil:
		return fmt.Errorf("uninstall: %w", err)
	case st.Original != nil && sum(data) == st.WrittenSHA256:
		orig := filepath.Join(in.ConfDir, st.Original.File)
		if err := atomicfile.Write(orig, st.Original.Bytes, st.Original.Mode); err != nil {
			return fmt.Errorf("uninstall: %w", err)
		}
		if orig != path {
			if err := os.Remove(path); err != nil {
				return fmt.Errorf("uninstall: %w", err)
			}
		}
		in.Log.Info("Restored the original CNI configuration", "file", orig)
	default:
		if err := in.removeEntry(path, data, mode); err != nil {
			return err
		}
	}
	if err := os.Remove(filepath.Join(in.ConfDir, StateFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("uninstall: %w", err)
	}
	return nil
}

// removeEverywhere removes the plugin's entries from every configuration
// (no state: the install was done by another version, or the state lost).
func (in *Installer) removeEverywhere() error {
	files, err := confFiles(in.ConfDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		path := filepath.Join(in.ConfDir, f)
		data, mode, err := readConf(path)
		if err != nil {
			continue
		}
		if c, err := parseConf(data); err != nil || len(c.ours()) == 0 {
			continue // not ours to touch
		}
		errs = append(errs, in.removeEntry(path, data, mode))
	}
	return errors.Join(errs...)
}

// removeEntry rewrites path without the plugin's entries.
func (in *Installer) removeEntry(path string, data []byte, mode fs.FileMode) error {
	c, err := parseConf(data)
	if err != nil {
		return fmt.Errorf("uninstall: refusing to change %s: %w", path, err)
	}
	if len(c.ours()) == 0 {
		return nil
	}
	n := c.withoutEntry()
	if len(n.plugins) == 0 {
		return fmt.Errorf("uninstall: refusing to change %s: %s is its only plugin", path, PluginType)
	}
	out, err := n.marshal()
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, out, mode); err != nil {
		return fmt.Errorf("uninstall: %w", err)
	}
	in.Log.Info("Removed the plugin from a CNI configuration changed since install", "file", path)
	return nil
}

// copyBinary installs Binary as BinDir/rdmavisor-cni, atomically, unless
// it is already there.
func (in *Installer) copyBinary() error {
	src, err := os.ReadFile(in.Binary)
	if err != nil {
		return fmt.Errorf("install: reading the plugin binary: %w", err)
	}
	dst := filepath.Join(in.BinDir, PluginType)
	if cur, err := os.ReadFile(dst); err == nil && bytes.Equal(cur, src) {
		return nil
	}
	if err := atomicfile.Write(dst, src, 0o755); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	in.Log.Info("Installed the plugin binary", "path", dst)
	return nil
}
