package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Version is the admin protocol version.
const Version = 1

// MaxMessage bounds an admin request or reply.
const MaxMessage = 64 << 10

// Operations.
const (
	OpStatus           = "status"
	OpCreateAllocation = "createAllocation"
	OpDeleteAllocation = "deleteAllocation"
	OpListAllocations  = "listAllocations"
	OpRegisterPod      = "registerPod"
	OpUnregisterPod    = "unregisterPod"
	OpListPods         = "listPods"
	// OpBindAllocation names the pod a pod-scoped allocation belongs to
	// (ID, and Pod's namespace and name): the device plugin learns it
	// from the kubelet's pod-resources API.
	OpBindAllocation = "bindAllocation"
	// OpRenewCertificate replaces the agent's node certificate now
	// (agents that request their own: Kubernetes discovery with TLS).
	OpRenewCertificate = "renewCertificate"
)

// Codes of a failed request (Reply.Code, Error.Code).
const (
	CodeInvalid   = "invalid"
	CodeExists    = "exists"
	CodeNotFound  = "notFound"
	CodeQuota     = "quota"
	CodeVersion   = "version"
	CodeMalformed = "malformed" // the agent closes the connection after the reply
	CodeFailed    = "failed"    // the request was valid and could not be done
	// CodeUnavailable: valid, and refused for now (every rail down); the
	// caller retries.
	CodeUnavailable = "unavailable"
)

// ErrExists, ErrNotFound and ErrQuota classify failures: the agent's own
// errors wrap them, and an *Error with the matching code is one of them.
var (
	ErrExists   = errors.New("agent: already exists")
	ErrNotFound = errors.New("agent: not found")
	ErrQuota    = errors.New("agent: not enough vconns left on the node")
	// ErrUnavailable: the agent cannot serve it now (its rails are down)
	// and may later.
	ErrUnavailable = errors.New("agent: unavailable for now")
)

// SocketName is the allocation socket's name in its directory,
// <socketDir>/alloc/<id>/: the device plugin mounts the directory into the
// pod.
const SocketName = "vconn.sock"

// Request is one admin request: one JSON document per datagram.
type Request struct {
	Version    int         `json:"version"`
	Op         string      `json:"op"`
	Allocation *Allocation `json:"allocation,omitempty"` // create
	ID         string      `json:"id,omitempty"`         // delete allocation, unregister pod (UID)
	Pod        *Pod        `json:"pod,omitempty"`        // register
}

// Reply answers a Request.
type Reply struct {
	Version     int          `json:"version"`
	Error       string       `json:"error,omitempty"`
	Code        string       `json:"code,omitempty"` // "invalid", "exists", "notFound", "quota", "internal"
	Allocation  *Allocation  `json:"allocation,omitempty"`
	Allocations []Allocation `json:"allocations,omitempty"`
	Pods        []Pod        `json:"pods,omitempty"`
	Status      *Status      `json:"status,omitempty"`
	Certificate *Certificate `json:"certificate,omitempty"`
}

// Certificate describes the agent's node certificate.
type Certificate struct {
	Serial    string    `json:"serial"`
	Subject   string    `json:"subject"`
	NotBefore time.Time `json:"notBefore"`
	NotAfter  time.Time `json:"notAfter"`
}

// Allocation is a share of the node's vconns with its own socket.
type Allocation struct {
	ID     string `json:"id"`
	VConns int    `json:"vconns"`
	Socket string `json:"socket,omitempty"` // set by the agent
	InUse  int    `json:"inUse,omitempty"`  // set by the agent
	// Listeners is how many ports it listens on (set by the agent).
	Listeners int `json:"listeners,omitempty"`
	// PodScoped: the allocation belongs to a pod (the device plugin's),
	// and listens and dials only as that pod, once bound to it
	// (OpBindAllocation). Otherwise it serves host services on the
	// node's own port space (standalone agents, tests).
	PodScoped bool `json:"podScoped,omitempty"`
	// Pod is the pod it is bound to, "namespace/name" (set by the agent).
	Pod string `json:"pod,omitempty"`
	// Rail is the agent's device (rail) whose engine carries its vconns:
	// 0, the first, unless the creator chose another (by the NUMA node
	// of the pod, as the device plugin places it).
	Rail int `json:"rail,omitempty"`
}

// Pod is a pod the CNI plugin registered.
type Pod struct {
	UID         string   `json:"uid"`
	Namespace   string   `json:"namespace"`
	Name        string   `json:"name"`
	IPs         []string `json:"ips,omitempty"`
	Netns       string   `json:"netns,omitempty"`
	ContainerID string   `json:"containerID,omitempty"`
}

// Status is the agent's state.
type Status struct {
	Ready     bool   `json:"ready"`
	Node      string `json:"node"`
	Capacity  int    `json:"capacity"`  // vconns per node
	Allocated int    `json:"allocated"` // sum of the allocations' quotas
	VConns    int    `json:"vconns"`    // open in the engine
	QPs       int    `json:"qps"`
	Peers     int    `json:"peers"`
	// Device, GID and Control say where peers reach this agent.
	Device  string `json:"device,omitempty"`
	GID     string `json:"gid,omitempty"`
	Control string `json:"control,omitempty"`
	// Unreachable are the peer nodes whose agents stopped answering this
	// one's heartbeats, sorted.
	Unreachable []string `json:"unreachable,omitempty"`
	// Rails are the agent's devices, an engine each, rail 0 (Device,
	// GID) first.
	Rails []Rail `json:"rails,omitempty"`
}

// Rail is one of an agent's devices and the use of its engine.
type Rail struct {
	Device    string `json:"device"`
	GID       string `json:"gid"`
	LinkLayer string `json:"linkLayer,omitempty"`
	// NUMANode of the device, -1 when unknown.
	NUMANode int `json:"numaNode"`
	// Allocated is the sum of the quotas of the allocations bound to
	// the rail (their share of Status.Capacity).
	Allocated int `json:"allocated"`
	VConns    int `json:"vconns"`
	QPs       int `json:"qps"`
	Peers     int `json:"peers"`
	// Down says why the rail's device cannot carry vconns (its port is
	// not ACTIVE, or the device is gone); empty while it is healthy. No
	// new allocation is bound to a rail that is down.
	Down string `json:"down,omitempty"`
}

// DecodeRequest parses one admin request strictly: unknown fields and
// trailing data are errors.
func DecodeRequest(b []byte) (Request, error) {
	var req Request
	if len(b) > MaxMessage {
		return req, errors.New("request larger than 64 KiB")
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		return req, fmt.Errorf("decoding request: %w", err)
	}
	if _, err := d.Token(); err != io.EOF {
		return req, errors.New("trailing data after the request")
	}
	return req, nil
}
