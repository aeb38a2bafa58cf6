package main

import (
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"
)

func TestServeAnswersEachCommand(t *testing.T) {
	in := strings.NewReader("alloc node-a x 2\n\nalloc node-z y 1\nalloc node-b y 0\nalloc node-b\nfree node-a x\nquit\nalloc node-a late 1\n")
	var out bytes.Buffer
	if err := run(in, &out, io.Discard, "rc", false); err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(&out)
	var hello struct{ Nodes []node }
	if err := dec.Decode(&hello); err != nil {
		t.Fatal(err)
	}
	if len(hello.Nodes) != 2 || hello.Nodes[0] != (node{"node-a", "127.0.0.2"}) || hello.Nodes[1] != (node{"node-b", "127.0.0.3"}) {
		t.Fatalf("nodes %+v", hello.Nodes)
	}
	want := []string{"socket", "no node", "want a count", "want alloc NODE ID K", "unknown command"}
	for i, w := range want {
		var r reply
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("reply %d: %v", i, err)
		}
		got := r.Error
		if w == "socket" {
			if r.Socket == "" || !strings.HasSuffix(r.Socket, ".sock") {
				t.Fatalf("reply %d: %+v, want a socket", i, r)
			}
			continue
		}
		if !strings.Contains(got, w) {
			t.Fatalf("reply %d: %+v, want an error with %q", i, r, w)
		}
	}
	if dec.More() {
		t.Fatal("replies after quit")
	}
}

func TestServeRefusesUnknownTransport(t *testing.T) {
	err := run(strings.NewReader(""), io.Discard, io.Discard, "tcp", false)
	if err == nil || !strings.Contains(err.Error(), `transport "tcp"`) {
		t.Fatalf("err %v", err)
	}
}
