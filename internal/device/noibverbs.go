//go:build !ibverbs

package device

import (
	"errors"

	"github.com/rdmavisor/rdmavisor/internal/config"
	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// openIBVerbs refuses: without the ibverbs build tag the binary has no cgo
// libibverbs backend (ibverbs.go).
func openIBVerbs(config.DeviceConfig) (verbs.Device, error) {
	return nil, &OpenError{reason: ReasonNotBuiltIn, Err: errors.New("device provider ibverbs is not built in: build with -tags ibverbs, or use provider soft")}
}
