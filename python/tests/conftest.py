"""Fixtures: two node agents in a helper process (hack/cmd/testagent), and
allocations on them.

The helper is $RDMAVISOR_TESTAGENT (a command line; the Go test that runs
this suite sets it), else `go run ./hack/cmd/testagent` in the repository.
"""

import itertools
import json
import os
import shlex
import socket
import subprocess
import sys
import threading

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

try:
    import rdmavisor  # noqa: F401  (installed: pip install ./python)
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(_REPO, "python"))
    import rdmavisor  # noqa: F401

if os.environ.get("RDMAVISOR_PYTEST_INSTALLED") and not rdmavisor.__file__.startswith(sys.prefix):
    raise RuntimeError(f"rdmavisor imported from {rdmavisor.__file__}, not the installation in {sys.prefix}")


def listen_seqpacket(path, serve):
    """A unix SOCK_SEQPACKET listener on path, as the agent's socket, and
    the daemon thread that runs serve() on it (a fake agent's): both.
    The listener exists before the thread starts."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen()
    t = threading.Thread(target=serve, daemon=True)
    return srv, t


class Agents:
    """A running testagent: node-a (127.0.0.2) and node-b (127.0.0.3)."""

    _ids = itertools.count(1)

    def __init__(self, *args):
        cmd = shlex.split(os.environ.get("RDMAVISOR_TESTAGENT", "")) or ["go", "run", "./hack/cmd/testagent"]
        self._p = subprocess.Popen(cmd + list(args), cwd=_REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   text=True)
        self._lock = threading.Lock()
        line = self._p.stdout.readline()
        if not line:
            raise RuntimeError(f"testagent ({' '.join(cmd)}) exited with {self._p.wait()} before announcing its agents")
        self.nodes = json.loads(line)["nodes"]

    def alloc(self, node="node-a", k=16):
        """A new allocation of k vconns on node: its socket path."""
        with self._lock:
            self._p.stdin.write(f"alloc {node} py{next(self._ids)} {k}\n")
            self._p.stdin.flush()
            r = json.loads(self._p.stdout.readline())
        if "error" in r:
            raise RuntimeError(f"testagent: {r['error']}")
        return r["socket"]

    def client(self, node="node-a", k=16):
        return rdmavisor.Client(self.alloc(node, k))

    def close(self):
        self._p.stdin.write("quit\n")
        self._p.stdin.flush()
        self._p.wait(30)


@pytest.fixture(scope="session")
def agents():
    a = Agents()
    yield a
    a.close()


_ports = itertools.count(7000)


@pytest.fixture
def port():
    """A port no other test of the run listens on."""
    return next(_ports)


@pytest.fixture
def pair(agents, port):
    """A vconn dialled from node-a to a listener on node-b, and the vconn
    the listener accepted: (client side, server side)."""
    server = agents.client("node-b")
    client = agents.client("node-a")
    ln = server.listen(port)
    c = client.dial(f"node-b:{port}")
    s = ln.accept(timeout=10)
    yield c, s
    for x in (c, s, ln, client, server):
        x.close()


def echo(conn):
    """Writes back what conn reads until the end of its stream, then closes it."""
    try:
        while True:
            b = conn.recv(1 << 16)
            if not b:
                break
            conn.sendall(b)
        conn.close()
    except rdmavisor.VConnError:
        pass  # the test ended its client, or the agent


@pytest.fixture
def echo_server(agents, port):
    """An echo listener on node-b, each vconn served by a thread: its
    address."""
    server = agents.client("node-b")
    ln = server.listen(port)

    def serve():
        while True:
            try:
                c = ln.accept()
            except rdmavisor.VConnError:
                return
            threading.Thread(target=echo, args=(c,), daemon=True).start()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"node-b:{port}"
    ln.close()
    server.close()
    t.join(10)
