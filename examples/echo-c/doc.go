// Package echoc holds the echo example in C (src/echo.c, built by its
// Makefile into one static binary with libvconn); it has no Go code. Its
// Go test builds the program and runs its client against its server
// through two agents (internal/agent/agenttest), checking what the
// programs print and the verdict and ready files they write.
package echoc
