//go:build e2e

package e2e

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The echo example in C and in Python (examples/echo-c, examples/echo-py):
// their images (hack/images.sh) run in pods beside the Go one's, across
// nodes, and each language's client checks every byte another language's
// server echoes.

const (
	echoCImage  = "local.test/rdmavisor-echo-c:dev"
	echoPyImage = "local.test/rdmavisor-echo-py:dev"
)

var (
	// cEcho is one static binary, /echo, as the Go example is.
	cEcho = app{lang: "c", image: echoCImage, exe: []string{"/echo"}}
	// pyEcho's entrypoint is its script; the image carries the
	// interpreter it names (#!/usr/bin/python3).
	pyEcho = app{lang: "py", image: echoPyImage, exe: []string{"/echo.py"}}
)

// languages runs a C server with a Go client, a Go server with a Python
// client, and a Python server with a C client, each server on
// e.serverNode() and each client on e.clientNode(); every client's verdict
// says every byte came back. The pods are deleted after each pair.
func (e *env) languages() {
	l := load{conns: 2, msgs: 300, size: 4096}
	for _, pair := range []struct{ server, client app }{{cEcho, goEcho}, {goEcho, pyEcho}, {pyEcho, cEcho}} {
		server := fmt.Sprintf("lang-%s-server", pair.server.lang)
		client := fmt.Sprintf("lang-%s-client-of-%s", pair.client.lang, pair.server.lang)
		start := time.Now()
		e.createPod(e.appServerPod(pair.server, server, e.serverNode(), 4))
		e.eventually(server+" listening", 2*time.Minute, func() (bool, string) {
			p, err := e.kube.CoreV1().Pods("default").Get(e.ctx, server, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			return podReady(p), fmt.Sprintf("phase %s\n%s", p.Status.Phase, e.logs(server))
		})
		e.startAppClient(pair.client, client, e.clientNode(), e.podIP(server), l)
		e.clientOK(client, l, 3*time.Minute)
		e.t.Logf("%s server, %s client: every byte checked in %s (pods started and run)", pair.server.lang, pair.client.lang, time.Since(start).Round(time.Millisecond))
		e.deletePod(client)
		e.deletePod(server)
	}
}
