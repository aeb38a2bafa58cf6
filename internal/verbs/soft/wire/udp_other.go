//go:build !linux

package wire

import (
	"errors"
	"net/netip"

	"github.com/rdmavisor/rdmavisor/internal/verbs"
)

// UDP is a Wire over one UDP socket. It needs sendmmsg and recvmmsg, so it
// exists on Linux only; elsewhere ListenUDP fails.
type UDP struct{}

var _ Wire = (*UDP)(nil)

// ListenUDP fails: the UDP wire is implemented on Linux only.
func ListenUDP(cfg UDPConfig) (*UDP, error) {
	if _, err := cfg.withDefaults(); err != nil {
		return nil, err
	}
	return nil, errors.ErrUnsupported
}

func (u *UDP) LocalGID() verbs.GID              { return verbs.GID{} }
func (u *UDP) LocalAddr() netip.AddrPort        { return netip.AddrPort{} }
func (u *UDP) Port() uint16                     { return 0 }
func (u *UDP) SocketBuffers() (read, write int) { return 0, 0 }
func (u *UDP) Send(pkts []Packet) (int, error)  { return 0, errClosed }
func (u *UDP) Recv(pkts []Packet) (int, error)  { return 0, errClosed }
func (u *UDP) Close() error                     { return nil }
func (u *UDP) PortState() (verbs.PortState, error) {
	return 0, errClosed
}
func (u *UDP) Stats() Stats { return Stats{} }
