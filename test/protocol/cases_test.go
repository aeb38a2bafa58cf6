package protocol

import (
	"slices"
	"testing"

	"github.com/rdmavisor/rdmavisor/internal/frame"
)

// conformanceCase checks one rule of docs/protocol.md.
type conformanceCase struct {
	rule    string // the rule's label, "R3.2"
	name    string
	cluster string // the shared cluster it runs on; "" for none (it starts its own)
	// slow cases mostly wait (for the agent's own timeouts): they run in
	// parallel, after the others.
	slow bool
	run  func(t *testing.T, e *env)
}

// cases is the table, by section of the document.
var cases = slices.Concat(socketCases, frameCases, requestCases, shmCases, walkthroughCases, errorCases)

// TestConformance runs every case against real agents.
func TestConformance(t *testing.T) {
	for _, c := range cases {
		t.Run(c.rule+" "+c.name, func(t *testing.T) {
			if c.slow {
				t.Parallel()
			}
			e := &env{}
			if c.cluster != "" {
				e.cl = cluster(t, c.cluster)
				e.a, e.b = e.cl.Nodes[0], e.cl.Nodes[1]
			}
			c.run(t, e)
		})
	}
}

const (
	rc     = clusterRC
	ud     = clusterUD
	queued = clusterQueued
)

// requests are the ops a client sends (§2).
var requests = []frame.Op{frame.OpHello, frame.OpListen, frame.OpDial, frame.OpSend, frame.OpGrant, frame.OpClose,
	frame.OpExport, frame.OpUnexport, frame.OpLocalRead, frame.OpLocalWrite, frame.OpWrite, frame.OpRead, frame.OpShm}
