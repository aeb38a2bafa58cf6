// Command kubectl-rdmavisor is the kubectl plugin `kubectl rdmavisor`
// (status, pods, top, diagnose). This file only wires; the logic is in
// internal/kubectlplugin.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/rdmavisor/rdmavisor/internal/kubectlplugin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := kubectlplugin.Run(ctx, os.Args[1:], os.Stdout, os.Stderr, kubectlplugin.ConnectAPIServer)
	stop()
	os.Exit(code)
}
