package cni

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// PluginType is the plugin's binary name and its "type" in a conflist.
const PluginType = "rdmavisor-cni"

// SupportedVersions are the CNI spec versions the plugin speaks: those with
// chaining (prevResult), up to 1.1.0 (STATUS, GC).
var SupportedVersions = []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// VersionInfo is what VERSION reports.
var VersionInfo = version.PluginSupports(SupportedVersions...)

// Policy is what ADD does when the agent cannot be reached.
type Policy string

// Failure policies.
const (
	// FailOpen lets the pod start unregistered: its network works, and its
	// vconn calls fail (it holds no registration in the agent). The default.
	FailOpen Policy = "fail-open"
	// FailClosed fails ADD (CNI code 11, try again later), so the runtime
	// retries the sandbox until the agent answers; STATUS also fails while
	// the agent is not ready.
	FailClosed Policy = "fail-closed"
)

// Defaults of the plugin configuration.
const (
	DefaultPolicy  = FailOpen
	DefaultTimeout = 5 * time.Second
	maxTimeout     = time.Minute
)

// maxUnixPath is the longest unix socket path (sun_path without its NUL).
const maxUnixPath = 107

// Entry is the plugin's own part of its conflist entry, as the installer
// writes it:
//
//	{"type": "rdmavisor-cni", "adminSocket": "/var/run/rdmavisor/admin.sock",
//	 "failurePolicy": "fail-open", "timeout": "5s"}
//
// Every field but type is optional.
type Entry struct {
	Type string `json:"type"`
	// AdminSocket is the agent's admin socket on the host (default
	// config.DefaultAdminSocket).
	AdminSocket string `json:"adminSocket,omitempty"`
	// FailurePolicy is "fail-open" (default) or "fail-closed".
	FailurePolicy Policy `json:"failurePolicy,omitempty"`
	// Timeout bounds each conversation with the agent, a Go duration
	// between 1ms and 1m (default 5s).
	Timeout string `json:"timeout,omitempty"`
}

// Config is the plugin's stdin: the runtime's network configuration with
// its prevResult, and the plugin's own fields, defaults filled in.
type Config struct {
	types.PluginConf
	AdminSocket   string
	FailurePolicy Policy
	Timeout       time.Duration
}

// ParseConfig decodes and validates the plugin's stdin. It does not require
// a prevResult (DEL, STATUS and GC may come without one); when there is one
// it is parsed into PluginConf.PrevResult. Errors are *types.Error with the
// CNI code the runtime expects: ErrDecodingFailure for JSON that does not
// decode, ErrIncompatibleCNIVersion for a version the plugin does not
// speak, ErrInvalidNetworkConfig for a bad field.
func ParseConfig(stdin []byte) (*Config, error) {
	var raw struct {
		types.PluginConf
		AdminSocket   *string `json:"adminSocket"`
		FailurePolicy *string `json:"failurePolicy"`
		Timeout       *string `json:"timeout"`
	}
	if err := json.Unmarshal(stdin, &raw); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "rdmavisor-cni: decoding the network configuration", err.Error())
	}
	if raw.CNIVersion == "" {
		raw.CNIVersion = "0.1.0" // what the spec says an absent version means
	}
	if !slices.Contains(SupportedVersions, raw.CNIVersion) {
		return nil, types.NewError(types.ErrIncompatibleCNIVersion, "rdmavisor-cni: incompatible CNI version",
			fmt.Sprintf("cniVersion %q is not one of %v", raw.CNIVersion, SupportedVersions))
	}
	c := &Config{PluginConf: raw.PluginConf, AdminSocket: config.DefaultAdminSocket, FailurePolicy: DefaultPolicy, Timeout: DefaultTimeout}
	invalid := func(format string, a ...any) error {
		return types.NewError(types.ErrInvalidNetworkConfig, "rdmavisor-cni: invalid configuration", fmt.Sprintf(format, a...))
	}
	if raw.AdminSocket != nil {
		c.AdminSocket = *raw.AdminSocket
	}
	if err := checkSocketPath(c.AdminSocket); err != nil {
		return nil, invalid("adminSocket: %v", err)
	}
	if raw.FailurePolicy != nil {
		c.FailurePolicy = Policy(*raw.FailurePolicy)
	}
	if c.FailurePolicy != FailOpen && c.FailurePolicy != FailClosed {
		return nil, invalid("failurePolicy: must be %q or %q, got %q", FailOpen, FailClosed, c.FailurePolicy)
	}
	if raw.Timeout != nil {
		d, err := time.ParseDuration(*raw.Timeout)
		if err != nil || d < time.Millisecond || d > maxTimeout {
			return nil, invalid("timeout: must be a duration between 1ms and %v, got %q", maxTimeout, *raw.Timeout)
		}
		c.Timeout = d
	}
	if c.RawPrevResult != nil {
		if err := version.ParsePrevResult(&c.PluginConf); err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "rdmavisor-cni: decoding prevResult", err.Error())
		}
	}
	return c, nil
}

func checkSocketPath(p string) error {
	switch {
	case !filepath.IsAbs(p):
		return fmt.Errorf("must be an absolute path, got %q", p)
	case len(p) > maxUnixPath:
		return fmt.Errorf("must be at most %d bytes (a unix socket path), got %d", maxUnixPath, len(p))
	}
	return nil
}
