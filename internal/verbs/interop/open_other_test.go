//go:build !(ibverbs && linux)

package interop

import (
	"errors"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

func openIBV() (verbs.Device, error) {
	return nil, errors.New("interop: the guest side needs the ibv provider: build with -tags ibverbs")
}
