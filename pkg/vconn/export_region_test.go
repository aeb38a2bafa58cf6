package vconn

// WithoutFeatures makes the client's session use none of the features the
// agent offers, as a client that predates them: its regions go over the
// socket.
func (c *Client) WithoutFeatures() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.s.features = 0
}

// Staged reports whether the vconn's one-sided operations go through
// staging memory.
func (c *Conn) Staged() bool { return c.stg.Load() != nil }
