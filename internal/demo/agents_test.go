package demo

import (
	"bytes"
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
)

func TestAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Agents(ctx, &out, AgentsOptions{VConns: 200, Messages: 5, Pollers: 2}); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if !strings.Contains(out.String(), "messages/s") || !strings.Contains(out.String(), ", 2 pollers each") {
		t.Fatalf("output:\n%s", out.String())
	}
}

// TestDefaultPollers: the demo's two nodes share the machine, so each
// agent polls with half its CPUs, at least one.
func TestDefaultPollers(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 1, 4: 2, 16: 8} {
		runtime.GOMAXPROCS(procs)
		if got := (AgentsOptions{}).withDefaults().Pollers; got != want {
			t.Errorf("GOMAXPROCS %d: %d pollers, want %d", procs, got, want)
		}
	}
	if got := (AgentsOptions{Pollers: 3}).withDefaults().Pollers; got != 3 {
		t.Errorf("pollers set to 3: %d", got)
	}
}
