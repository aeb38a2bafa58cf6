package agent

import (
	"fmt"
	"sync"
)

// registeredPool counts the memory the regions and staging memory of all
// the agent's allocations keep registered (limits.registeredBytes), by
// allocation, to share it fairly rather than first come, first served:
// an allocation may hold at most its fair share, the limit divided by
// the allocations holding registered memory, itself included. A lone
// tenant may use the whole pool; once others hold some, none grows past
// its share. (This is max-min fairness with every holder presumed to want
// its share: room past one's share is room a holder below its own could
// still claim.) Memory already registered is never taken back: a tenant
// over its share when others arrive keeps what it holds, and claims more
// only once it is back under; a newcomer claims from what is free.
type registeredPool struct {
	mu    sync.Mutex
	held  map[*allocation]int64 // allocations holding registered memory; guarded by mu
	total int64                 // the sum of held; guarded by mu
}

// claim counts size bytes for al against limit, or refuses them with
// errLimit naming limits.registeredBytes. op names the request (export,
// stage).
func (p *registeredPool) claim(al *allocation, op string, size, limit int64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	mine := p.held[al] + size
	holders := len(p.held)
	if p.held[al] == 0 {
		holders++
	}
	if share := limit / int64(holders); mine > share {
		return fmt.Errorf("%s %d bytes: allocation %s would hold %d bytes registered, past its fair share of limits.registeredBytes, %d (%d bytes among the %d allocations holding registered memory): %w",
			op, size, al.id, mine, share, limit, holders, errLimit)
	}
	if size > limit-p.total {
		return fmt.Errorf("%s %d bytes: the node's allocations hold %d of the %d bytes of limits.registeredBytes: %w", op, size, p.total, limit, errLimit)
	}
	if p.held == nil {
		p.held = make(map[*allocation]int64)
	}
	p.held[al] = mine
	p.total += size
	return nil
}

// release gives back size bytes claim counted for al, once deregistered.
func (p *registeredPool) release(al *allocation, size int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total -= size
	if p.held[al] -= size; p.held[al] <= 0 {
		delete(p.held, al) // no longer a holder: the others' shares grow
	}
}
