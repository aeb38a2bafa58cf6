package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// AdminError is a failed admin request.
type AdminError struct {
	Code    string // "invalid", "exists", "notFound", "quota", "version", "malformed"
	Message string
}

func (e *AdminError) Error() string { return "agent admin: " + e.Code + ": " + e.Message }

// Is matches ErrExists, ErrNotFound and ErrQuota by code.
func (e *AdminError) Is(target error) bool {
	switch target {
	case ErrExists:
		return e.Code == "exists"
	case ErrNotFound:
		return e.Code == "notFound"
	case ErrQuota:
		return e.Code == "quota"
	}
	return false
}

// AdminClient talks to an agent's admin socket; the device plugin and the
// CNI plugin use it. It is safe for concurrent use (one request at a time).
type AdminClient struct {
	mu   sync.Mutex
	conn *net.UnixConn
	buf  []byte
}

// DialAdmin connects to the admin socket at path.
func DialAdmin(ctx context.Context, path string) (*AdminClient, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unixpacket", path)
	if err != nil {
		return nil, fmt.Errorf("agent admin: %w", err)
	}
	return &AdminClient{conn: c.(*net.UnixConn), buf: make([]byte, maxAdminMessage+1)}, nil
}

// Close closes the connection.
func (c *AdminClient) Close() error { return c.conn.Close() }

func (c *AdminClient) do(ctx context.Context, req AdminRequest) (*AdminReply, error) {
	req.Version = AdminVersion
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
	var rep AdminReply
	if err := json.Unmarshal(c.buf[:n], &rep); err != nil {
		return nil, fmt.Errorf("agent admin: %s: bad reply: %w", req.Op, err)
	}
	if rep.Code != "" || rep.Error != "" {
		return nil, &AdminError{Code: rep.Code, Message: rep.Error}
	}
	return &rep, nil
}

// CreateAllocation creates an allocation of k vconns; the reply names its
// socket.
func (c *AdminClient) CreateAllocation(ctx context.Context, id string, k int) (Allocation, error) {
	rep, err := c.do(ctx, AdminRequest{Op: AdminCreateAllocation, Allocation: &Allocation{ID: id, VConns: k}})
	if err != nil {
		return Allocation{}, err
	}
	if rep.Allocation == nil {
		return Allocation{}, errors.New("agent admin: createAllocation: no allocation in the reply")
	}
	return *rep.Allocation, nil
}

// DeleteAllocation deletes an allocation, closing its vconns.
func (c *AdminClient) DeleteAllocation(ctx context.Context, id string) error {
	_, err := c.do(ctx, AdminRequest{Op: AdminDeleteAllocation, ID: id})
	return err
}

// ListAllocations lists the allocations.
func (c *AdminClient) ListAllocations(ctx context.Context) ([]Allocation, error) {
	rep, err := c.do(ctx, AdminRequest{Op: AdminListAllocations})
	if err != nil {
		return nil, err
	}
	return rep.Allocations, nil
}

// RegisterPod records a pod.
func (c *AdminClient) RegisterPod(ctx context.Context, p Pod) error {
	_, err := c.do(ctx, AdminRequest{Op: AdminRegisterPod, Pod: &p})
	return err
}

// UnregisterPod forgets a pod; unknown pods are not an error.
func (c *AdminClient) UnregisterPod(ctx context.Context, uid string) error {
	_, err := c.do(ctx, AdminRequest{Op: AdminUnregisterPod, ID: uid})
	return err
}

// ListPods lists the registered pods.
func (c *AdminClient) ListPods(ctx context.Context) ([]Pod, error) {
	rep, err := c.do(ctx, AdminRequest{Op: AdminListPods})
	if err != nil {
		return nil, err
	}
	return rep.Pods, nil
}

// Status reports the agent's state.
func (c *AdminClient) Status(ctx context.Context) (Status, error) {
	rep, err := c.do(ctx, AdminRequest{Op: AdminStatus})
	if err != nil {
		return Status{}, err
	}
	if rep.Status == nil {
		return Status{}, errors.New("agent admin: status: no status in the reply")
	}
	return *rep.Status, nil
}
