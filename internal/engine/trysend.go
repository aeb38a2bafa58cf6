package engine

import "context"

// TrySendImm is TrySend with an application immediate: a poller serving
// many vconns from one goroutine (the agent's shared-memory rings) must
// not block on one of them.
func (vc *VConn) TrySendImm(data []byte, imm uint32) (bool, error) {
	return vc.send(context.Background(), data, imm, true, false)
}
