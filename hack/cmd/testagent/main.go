// Command testagent runs two node agents in one process, for clients that
// are not written in Go (the Python package's tests, libvconn's): node-a
// on 127.0.0.2 and node-b on 127.0.0.3, each on the software RDMA
// provider (internal/agent/agenttest). It prints the nodes as one JSON
// line, then serves allocations on request, one command a line on stdin:
//
//	alloc NODE ID K    a host-services allocation of K vconns on NODE;
//	                   answers {"socket": PATH} or {"error": MESSAGE}
//	quit               stops the agents (as does the end of stdin)
//
//	testagent [-transport rc|uc|ud|auto] [-v]
package main

import (
	"flag"
	"log"
	"os"
)

func main() {
	log.SetFlags(0)
	log.SetPrefix("testagent: ")
	transport := flag.String("transport", "rc", "the agents' vconn transport: rc, uc, ud or auto")
	verbose := flag.Bool("v", false, "log the agents' messages to stderr")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, os.Stderr, *transport, *verbose); err != nil {
		log.Fatal(err)
	}
}
