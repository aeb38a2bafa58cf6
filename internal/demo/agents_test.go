package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

func TestAgents(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := Agents(ctx, &out, AgentsOptions{VConns: 200, Messages: 5}); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if !strings.Contains(out.String(), "messages/s") {
		t.Fatalf("output:\n%s", out.String())
	}
}
