package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/rdmavisor/rdmavisor/internal/agent/agenttest"
	"github.com/rdmavisor/rdmavisor/internal/config"
)

// node is what a client learns of an agent: how to dial its host services
// ("NAME:port" or "IP:port").
type node struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
}

// reply answers one command.
type reply struct {
	Socket string `json:"socket,omitempty"`
	Error  string `json:"error,omitempty"`
}

// run starts the agents, announces them on out and serves the commands
// of in until quit or its end.
func run(in io.Reader, out, logw io.Writer, transport string, verbose bool) error {
	t := config.Transport(transport)
	switch t {
	case config.TransportRC, config.TransportUC, config.TransportUD, config.TransportAuto:
	default:
		return fmt.Errorf("transport %q: want rc, uc, ud or auto", transport)
	}
	lg := logr.Discard()
	if verbose {
		lg = funcr.New(func(prefix, args string) { fmt.Fprintln(logw, prefix, args) }, funcr.Options{})
	}
	c, err := agenttest.Start(agenttest.Options{Log: lg, Transport: t})
	if err != nil {
		return fmt.Errorf("start agents: %w", err)
	}
	defer c.Close()
	enc := json.NewEncoder(out)
	var nodes []node
	for _, n := range c.Nodes {
		nodes = append(nodes, node{Name: n.Name, IP: n.IP})
	}
	if err := enc.Encode(map[string]any{"nodes": nodes}); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if fields[0] == "quit" {
			return nil
		}
		var r reply
		if r.Socket, err = command(c, fields); err != nil {
			r.Error = err.Error()
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return sc.Err()
}

// command serves one command but quit; it returns the socket made.
func command(c *agenttest.Cluster, fields []string) (string, error) {
	if fields[0] != "alloc" {
		return "", fmt.Errorf("unknown command %q: want alloc NODE ID K, or quit", fields[0])
	}
	if len(fields) != 4 {
		return "", errors.New("want alloc NODE ID K")
	}
	k, err := strconv.Atoi(fields[3])
	if err != nil || k < 1 {
		return "", fmt.Errorf("alloc: K %q: want a count of at least 1", fields[3])
	}
	for _, n := range c.Nodes {
		if n.Name == fields[1] {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return n.Allocate(ctx, fields[2], k)
		}
	}
	return "", fmt.Errorf("alloc: no node %q", fields[1])
}
