package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
)

// TestE1Pollers: E1's pollers reach both designs' endpoints, and its lines
// say how many there were.
func TestE1Pollers(t *testing.T) {
	tb, err := openTestbed("fabric")
	if err != nil {
		t.Fatal(err)
	}
	defer tb.close()
	for _, name := range []string{designEngine, designNaive} {
		d, err := openDesignPollers(name, tb, &counter{}, 3)
		if err != nil {
			t.Fatal(err)
		}
		var got [2]int
		switch d := d.(type) {
		case *engineDesign:
			got = [2]int{d.a.Config().Pollers, d.b.Config().Pollers}
		case *naiveDesign:
			got = [2]int{d.a.Config().Pollers, d.b.Config().Pollers}
		}
		if err := d.close(); err != nil {
			t.Fatal(err)
		}
		if got != [2]int{3, 3} {
			t.Errorf("%s: endpoints poll with %v goroutines, want 3 each", name, got)
		}
	}

	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := tinyPlan()
	p.E1VConns, p.Pollers = []int{10}, 2
	// Longer than tinyPlan's windows: under -race on a busy 2-core
	// machine, 50 ms after a 20 ms warm-up were seen to deliver nothing.
	p.Warmup, p.Measure = 200*time.Millisecond, 300*time.Millisecond
	if err := Run(ctx, Options{Suites: []string{"e1"}, Plan: p, Out: &out, Log: testr.NewWithInterface(t, testr.Options{})}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	for _, line := range lines {
		var r Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.Pollers != 2 || r.Error != "" || r.MsgsPerSec == nil {
			t.Errorf("line %s: want pollers 2 and a rate", line)
		}
	}
	if len(lines) != 2 {
		t.Errorf("%d lines, want 2 (engine, naive):\n%s", len(lines), out.String())
	}
	p.Pollers = 65
	if err := Run(ctx, Options{Suites: []string{"e1"}, Plan: p, Out: &out}); err == nil || !strings.Contains(err.Error(), "65 pollers") {
		t.Errorf("65 pollers: %v", err)
	}
}

// TestE1NICModel: with the model in the plan, every count runs for both
// designs with it off and on, and the lines say which.
func TestE1NICModel(t *testing.T) {
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := tinyPlan()
	p.E1VConns, p.E1NICModels = []int{10}, []bool{false, true}
	// As TestE1Pollers: windows long enough for a busy machine.
	p.Warmup, p.Measure = 200*time.Millisecond, 300*time.Millisecond
	if err := Run(ctx, Options{Suites: []string{"e1"}, Plan: p, Out: &out, Log: testr.NewWithInterface(t, testr.Options{})}); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var r Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.Error != "" || r.MsgsPerSec == nil {
			t.Errorf("line %s: want a rate", line)
		}
		seen[fmt.Sprintf("%s/%v", r.Design, r.NICModel)] = true
	}
	for _, k := range []string{"engine/false", "naive/false", "engine/true", "naive/true"} {
		if !seen[k] {
			t.Errorf("no line for %s:\n%s", k, out.String())
		}
	}
}
