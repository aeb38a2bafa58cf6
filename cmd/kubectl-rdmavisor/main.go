// Command kubectl-rdmavisor is the kubectl plugin `kubectl rdmavisor`
// (status, pods, top, diagnose). This file only wires; the logic is in
// internal/kubectlplugin.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"

	"github.com/rdmavisor/rdmavisor/internal/kubectlplugin"
)

func main() {
	// client-go logs through klog what it handles itself (a port-forward's
	// teardown racing its last copy, an error it retries): the plugin says
	// its own errors, and its output, tables or -o json, is not to be mixed
	// with those lines.
	klog.SetLogger(logr.Discard())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := kubectlplugin.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, kubectlplugin.ConnectAPIServer)
	stop()
	os.Exit(code)
}
