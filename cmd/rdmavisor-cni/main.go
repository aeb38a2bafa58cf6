// Command rdmavisor-cni is the RDMAvisor chained CNI plugin, run by the
// container runtime, and its installer:
//
//	rdmavisor-cni install --config=agent.yaml --cni-bin-dir=DIR --cni-conf-dir=DIR [--failure-policy=fail-open] [--wait=5m] [--keep]
//	rdmavisor-cni uninstall --cni-bin-dir=DIR --cni-conf-dir=DIR
//
// See package internal/cni.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"k8s.io/klog/v2/textlogger"

	"github.com/rdmavisor/rdmavisor/internal/cni"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

func main() {
	if len(os.Args) > 1 && (os.Args[1] == "install" || os.Args[1] == "uninstall") {
		if err := installer(os.Args[1], os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "rdmavisor-cni %s: %v\n", os.Args[1], err)
			os.Exit(1)
		}
		return
	}
	log := textlogger.NewLogger(textlogger.NewConfig(textlogger.Output(os.Stderr))).WithName(cni.PluginType)
	p := &cni.Plugin{Stdout: os.Stdout, Log: log}
	skel.PluginMainFuncs(p.Funcs(), cni.VersionInfo, "RDMAvisor chained CNI plugin (registers pods with the node agent)")
}

func installer(cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	var (
		cfgPath, binDir, confDir, policy string
		v                                int
		wait                             time.Duration
		keep                             bool
	)
	fs.StringVar(&cfgPath, "config", "", "agent configuration file (AgentConfig YAML) naming the admin socket; empty: defaults")
	fs.StringVar(&binDir, "cni-bin-dir", "/opt/cni/bin", "the node's CNI binary directory")
	fs.StringVar(&confDir, "cni-conf-dir", "/etc/cni/net.d", "the node's CNI configuration directory")
	fs.StringVar(&policy, "failure-policy", string(cni.DefaultPolicy), "what ADD does when the agent is unreachable: fail-open or fail-closed")
	fs.DurationVar(&wait, "wait", 5*time.Minute, "install: how long to wait for the primary CNI configuration to appear (0: fail at once)")
	fs.BoolVar(&keep, "keep", false, "install: keep running, repair the installation when it is lost, and uninstall on SIGTERM (the agent pod's sidecar)")
	fs.IntVar(&v, "v", 0, "log verbosity")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	in := &cni.Installer{ConfDir: confDir, BinDir: binDir,
		Log: textlogger.NewLogger(textlogger.NewConfig(textlogger.Verbosity(v), textlogger.Output(os.Stderr)))}
	if cmd == "uninstall" {
		return in.Uninstall()
	}
	cfg := config.Default()
	if cfgPath != "" {
		data, err := os.ReadFile(cfgPath)
		if err != nil {
			return err
		}
		if cfg, err = config.Load(data); err != nil {
			return fmt.Errorf("%s: %w", cfgPath, err)
		}
	}
	entry, err := cni.EntryFor(cfg, cni.Policy(policy))
	if err != nil {
		return err
	}
	in.Entry = entry
	self, err := os.Executable()
	if err != nil {
		return errors.Join(errors.New("finding the plugin binary"), err)
	}
	in.Binary = self
	if keep {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return in.Keep(ctx, 5*time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	_, err = in.InstallWhenReady(ctx, 2*time.Second)
	return err
}
