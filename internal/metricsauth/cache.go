package metricsauth

import (
	"container/list"
	"crypto/sha256"
	"sync"
	"time"
)

// cacheKey names a decision: who (a hash of the credential, so that no
// token is kept in memory) asked to do what.
type cacheKey struct {
	cred [sha256.Size]byte
	path string
	verb string
}

// decision is the outcome of authentication and authorization: code is
// http.StatusOK when allowed, else the status to answer with msg.
type decision struct {
	code int
	msg  string
}

type cacheEntry struct {
	key     cacheKey
	d       decision
	expires time.Time
}

// cache keeps at most max decisions, each until it expires; when full,
// the oldest added goes, so that a flood of distinct tokens bounds
// memory.
type cache struct {
	mu    sync.Mutex
	max   int
	order *list.List // of *cacheEntry, oldest first
	byKey map[cacheKey]*list.Element
}

func newCache(max int) *cache {
	return &cache{max: max, order: list.New(), byKey: make(map[cacheKey]*list.Element)}
}

// get returns the decision for k unless none is cached or it expired
// at now.
func (c *cache) get(k cacheKey, now time.Time) (decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[k]
	if !ok {
		return decision{}, false
	}
	e := el.Value.(*cacheEntry)
	if !now.Before(e.expires) {
		c.remove(el)
		return decision{}, false
	}
	return e.d, true
}

// put caches d for k until expires, evicting the oldest entries beyond
// max.
func (c *cache) put(k cacheKey, d decision, expires time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[k]; ok {
		c.remove(el)
	}
	c.byKey[k] = c.order.PushBack(&cacheEntry{key: k, d: d, expires: expires})
	for c.order.Len() > c.max {
		c.remove(c.order.Front())
	}
}

func (c *cache) remove(el *list.Element) {
	delete(c.byKey, el.Value.(*cacheEntry).key)
	c.order.Remove(el)
}

// len is the number of entries, expired ones included.
func (c *cache) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}
