package device

import (
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// Open opens the soft provider where the configuration binds one, and
// refuses, saying why, what it cannot open.
func TestOpen(t *testing.T) {
	soft := config.Default()
	soft.Device.Provider = config.ProviderSoft
	soft.Soft.BindAddress = "127.0.0.1"
	soft.Soft.UDPPort = 0 // any free port
	dev, err := Open(soft)
	if err != nil {
		t.Fatalf("soft on 127.0.0.1: %v", err)
	}
	if err := dev.Close(); err != nil {
		t.Fatal(err)
	}

	unbound := *soft
	unbound.Soft.BindAddress = ""
	unknown := *soft
	unknown.Device.Provider = "magic"
	for name, c := range map[string]struct {
		cfg  config.AgentConfig
		want string
	}{
		"soft without an address": {unbound, "no bind address"},
		"unknown provider":        {unknown, `"magic"`},
	} {
		if _, err := Open(&c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %s", name, err, c.want)
		}
	}
}
