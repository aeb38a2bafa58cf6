package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/device"
	"github.com/rdmavisor/rdmavisor/internal/rdmanode"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// An agent whose device does not open stays alive for the kubelet
// (/healthz 200), not ready and why (/readyz 503), records the error for
// its RDMANode, and frees the metrics address for the agent once the
// device opens.
func TestWaitForDevice(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	cfg := config.Default()
	cfg.MetricsAddress = addr
	cfg.Device = config.DeviceConfig{Provider: config.ProviderIBVerbs, Names: []string{"mlx5_9"}}

	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	var node rdmanode.Pending
	opened := make(chan struct{})
	dev := &struct{ verbs.Device }{}
	tries := 0
	open := func(c *config.AgentConfig) (verbs.Device, error) {
		tries++
		select {
		case <-opened:
			return dev, nil
		default:
			return device.Open(c) // not built in, or no mlx5_9 here
		}
	}
	type result struct {
		dev verbs.Device
		err error
	}
	res := make(chan result, 1)
	go func() {
		d, err := waitForDevice(context.Background(), cfg, open, device.Backoff{Min: 10 * time.Millisecond, Max: 20 * time.Millisecond}, testr.New(t), &node, nil)
		res <- result{d, err}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, _ := get("/healthz")
		if code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no /healthz while waiting for the device")
		}
		time.Sleep(10 * time.Millisecond)
	}
	code, body := get("/readyz")
	if err := node.DeviceError(); code != http.StatusServiceUnavailable || err == nil || !strings.Contains(body, device.Reason(err)) || !strings.Contains(body, err.Error()) {
		t.Fatalf("/readyz while waiting: %d %q; recorded error %v", code, body, err)
	}
	close(opened)
	r := <-res
	if r.err != nil || r.dev != dev {
		t.Fatalf("waitForDevice: %v, %v", r.dev, r.err)
	}
	if tries < 2 {
		t.Errorf("%d tries", tries)
	}
	// The address is free for the agent's own server.
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("the metrics address after the wait: %v", err)
	}
	_ = ln.Close()

	// Stopped while waiting: the context's error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	never := func(*config.AgentConfig) (verbs.Device, error) { return nil, errors.New("no device") }
	if _, err := waitForDevice(ctx, cfg, never, device.Backoff{Min: time.Hour, Max: time.Hour}, testr.New(t), &node, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("waitForDevice after its context ended: %v", err)
	}
}
