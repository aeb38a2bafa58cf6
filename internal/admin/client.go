package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// Error is a failed admin request.
type Error struct {
	Code    string // CodeInvalid, CodeExists, CodeNotFound, CodeQuota, CodeUnavailable, CodeVersion, CodeMalformed, CodeFailed
	Message string
}

func (e *Error) Error() string { return "agent admin: " + e.Code + ": " + e.Message }

// Is matches ErrExists, ErrNotFound, ErrQuota and ErrUnavailable by code.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrExists:
		return e.Code == CodeExists
	case ErrNotFound:
		return e.Code == CodeNotFound
	case ErrQuota:
		return e.Code == CodeQuota
	case ErrUnavailable:
		return e.Code == CodeUnavailable
	}
	return false
}

// Client talks to an agent's admin socket; the device plugin and the CNI
// plugin use it. It is safe for concurrent use (one request at a time).
type Client struct {
	mu   sync.Mutex
	conn *net.UnixConn
	buf  []byte
}

// Dial connects to the admin socket at path.
func Dial(ctx context.Context, path string) (*Client, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("agent admin: %w", err)
	}
	return &Client{conn: c.(*net.UnixConn), buf: make([]byte, MaxMessage+1)}, nil
}

// Close closes the connection.
func (c *Client) Close() error { return c.conn.Close() }

func (c *Client) do(ctx context.Context, req Request) (*Reply, error) {
	req.Version = Version
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(30 * time.Second)
	}
	_ = c.conn.SetDeadline(dl)
	if _, err := c.conn.Write(b); err != nil {
		return nil, fmt.Errorf("agent admin: %s: %w", req.Op, err)
	}
	n, err := c.conn.Read(c.buf)
	if err != nil {
		return nil, fmt.Errorf("agent admin: %s: %w", req.Op, err)
	}
	if n == 0 {
		return nil, fmt.Errorf("agent admin: %s: connection closed", req.Op)
	}
	var rep Reply
	if err := json.Unmarshal(c.buf[:n], &rep); err != nil {
		return nil, fmt.Errorf("agent admin: %s: bad reply: %w", req.Op, err)
	}
	if rep.Code != "" || rep.Error != "" {
		return nil, &Error{Code: rep.Code, Message: rep.Error}
	}
	return &rep, nil
}

// CreateAllocation creates an allocation of k vconns; the reply names its
// socket.
func (c *Client) CreateAllocation(ctx context.Context, id string, k int) (Allocation, error) {
	return c.Create(ctx, Allocation{ID: id, VConns: k})
}

// Create creates the allocation al describes (ID, VConns, PodScoped,
// Rail).
func (c *Client) Create(ctx context.Context, al Allocation) (Allocation, error) {
	rep, err := c.do(ctx, Request{Op: OpCreateAllocation, Allocation: &Allocation{ID: al.ID, VConns: al.VConns, PodScoped: al.PodScoped, Rail: al.Rail}})
	if err != nil {
		return Allocation{}, err
	}
	if rep.Allocation == nil {
		return Allocation{}, errors.New("agent admin: createAllocation: no allocation in the reply")
	}
	return *rep.Allocation, nil
}

// BindAllocation names the pod (namespace/name) a pod-scoped allocation
// belongs to.
func (c *Client) BindAllocation(ctx context.Context, id, namespace, name string) error {
	_, err := c.do(ctx, Request{Op: OpBindAllocation, ID: id, Pod: &Pod{Namespace: namespace, Name: name}})
	return err
}

// DeleteAllocation deletes an allocation, closing its vconns.
func (c *Client) DeleteAllocation(ctx context.Context, id string) error {
	_, err := c.do(ctx, Request{Op: OpDeleteAllocation, ID: id})
	return err
}

// ListAllocations lists the allocations.
func (c *Client) ListAllocations(ctx context.Context) ([]Allocation, error) {
	rep, err := c.do(ctx, Request{Op: OpListAllocations})
	if err != nil {
		return nil, err
	}
	if rep.Allocations == nil {
		return []Allocation{}, nil // printed as [], not null
	}
	return rep.Allocations, nil
}

// RegisterPod records a pod.
func (c *Client) RegisterPod(ctx context.Context, p Pod) error {
	_, err := c.do(ctx, Request{Op: OpRegisterPod, Pod: &p})
	return err
}

// UnregisterPod forgets a pod; unknown pods are not an error.
func (c *Client) UnregisterPod(ctx context.Context, uid string) error {
	_, err := c.do(ctx, Request{Op: OpUnregisterPod, ID: uid})
	return err
}

// ListPods lists the registered pods.
func (c *Client) ListPods(ctx context.Context) ([]Pod, error) {
	rep, err := c.do(ctx, Request{Op: OpListPods})
	if err != nil {
		return nil, err
	}
	if rep.Pods == nil {
		return []Pod{}, nil // printed as [], not null
	}
	return rep.Pods, nil
}

// RenewCertificate makes the agent replace its node certificate now and
// returns the new one.
func (c *Client) RenewCertificate(ctx context.Context) (Certificate, error) {
	rep, err := c.do(ctx, Request{Op: OpRenewCertificate})
	if err != nil {
		return Certificate{}, err
	}
	if rep.Certificate == nil {
		return Certificate{}, errors.New("agent admin: renewCertificate: no certificate in the reply")
	}
	return *rep.Certificate, nil
}

// Status reports the agent's state.
func (c *Client) Status(ctx context.Context) (Status, error) {
	rep, err := c.do(ctx, Request{Op: OpStatus})
	if err != nil {
		return Status{}, err
	}
	if rep.Status == nil {
		return Status{}, errors.New("agent admin: status: no status in the reply")
	}
	return *rep.Status, nil
}
