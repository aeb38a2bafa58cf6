// Package clib holds libvconn, the C client library of the pod protocol
// (docs/protocol.md): vconn.h, src/ and the C tests in test/. It has no
// Go code; its Go test builds the library and the C tests under
// AddressSanitizer and UndefinedBehaviorSanitizer and runs them against
// agents it starts (internal/agent/agenttest), and FuzzCDecode feeds the
// library's parsers through a C harness, comparing with package frame.
package clib
