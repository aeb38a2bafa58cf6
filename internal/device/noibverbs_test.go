//go:build !ibverbs

package device

import (
	"strings"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/config"
)

// Without the ibverbs tag, provider ibverbs is refused with how to get it.
func TestIBVerbsNotBuiltIn(t *testing.T) {
	cfg := config.Default()
	cfg.Device.Provider = config.ProviderIBVerbs
	if _, err := Open(cfg); err == nil || !strings.Contains(err.Error(), "-tags ibverbs") {
		t.Fatalf("Open(ibverbs): %v, want the build hint", err)
	}
}
