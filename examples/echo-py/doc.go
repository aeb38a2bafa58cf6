// Package echopy holds the echo example in Python (echo.py, with the
// rdmavisor package of python/); it has no Go code. Its Go test installs
// the package into a virtual environment and runs the program's client
// against its server, and against the C example's server
// (examples/echo-c), through two agents (internal/agent/agenttest).
package echopy
