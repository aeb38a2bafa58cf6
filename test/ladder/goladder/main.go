// Command goladder is benchmark E6's program over package vconn in a
// process of its own, as a pod's program is (test/ladder runs the Go
// paths in its own process too, beside the agents, where a program's
// hand-off to its agent is a goroutine's, not another process's). It
// speaks clib/test/ladder.h, as clib/test/ladder.c does:
//
//	goladder server :PORT [shm]      listens, serves one client, exits
//	goladder client HOST:PORT [shm]  dials, runs the commands on stdin
//
// The allocation's socket is $RDMAVISOR_SOCKET; shm asks for
// shared-memory rings.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/rdmavisor/rdmavisor/pkg/vconn"
	"github.com/rdmavisor/rdmavisor/test/ladder/ladderproto"
)

func main() {
	if len(os.Args) < 3 || (os.Args[1] != "server" && os.Args[1] != "client") {
		fmt.Fprintln(os.Stderr, "usage: goladder server :PORT [shm] | client HOST:PORT [shm]")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2], len(os.Args) > 3 && os.Args[3] == "shm"); err != nil {
		fmt.Fprintf(os.Stderr, "error: %v\n", err)
		os.Exit(1)
	}
}

func run(mode, addr string, shm bool) error {
	ctx := context.Background()
	c, err := vconn.NewClient(ctx, vconn.Options{Socket: os.Getenv("RDMAVISOR_SOCKET"), SharedMemory: shm})
	if err != nil {
		return err
	}
	defer c.Close()
	if mode == "server" {
		return serve(ctx, c, addr)
	}
	v, err := c.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer v.Close()
	return commands(ladderproto.SDK{Ctx: ctx, C: v})
}

// serve listens at addr, says "ready ADDR" on stdout, and serves one
// client.
func serve(ctx context.Context, c *vconn.Client, addr string) error {
	ln, err := c.Listen(ctx, addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Printf("ready %s\n", ln.Addr())
	v, err := ln.AcceptVConn()
	if err != nil {
		return err
	}
	defer v.Close()
	return ladderproto.Serve(ladderproto.SDK{Ctx: ctx, C: v})
}

// commands runs the client's commands on stdin (ladder.h): pp, st, quit.
func commands(c ladderproto.Conn) error {
	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		n := make([]int, len(f)-1)
		for i, s := range f[1:] {
			var err error
			if n[i], err = strconv.Atoi(s); err != nil {
				return fmt.Errorf("command %q: %w", in.Text(), err)
			}
		}
		switch {
		case f[0] == "pp" && len(n) == 3:
			d, rtt, err := ladderproto.PingPong(c, n[0], n[1], n[2])
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "ok %d", d.Nanoseconds())
			for _, r := range rtt {
				fmt.Fprintf(out, " %d", r.Nanoseconds())
			}
			fmt.Fprintln(out)
		case f[0] == "st" && len(n) == 2:
			d, err := ladderproto.Stream(c, n[0], n[1])
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "ok %d\n", d.Nanoseconds())
		case f[0] == "quit":
			return c.Put(ladderproto.Header(ladderproto.OpQuit, 0, 0))
		default:
			return fmt.Errorf("unknown command %q", in.Text())
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
	if err := in.Err(); err != nil {
		return err
	}
	return errors.New("stdin ended before quit")
}
