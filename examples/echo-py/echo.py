#!/usr/bin/python3
"""The echo example (examples/echo) in Python, with the rdmavisor package.

    echo.py server --port 7000 [--ready FILE]
    echo.py client --addr HOST:7000 --conns 2 --messages 1000 --size 4096 [--verdict FILE]
    echo.py show FILE

The same flags, output and files as the Go program: the client prints
"echo: OK ..." and exits 0 when every message came back intact, and with
--verdict writes its outcome as JSON ({ok, error, at, sent, delivered}),
e.g. to a pod's /dev/termination-log; the server's --ready file says where
it listens. The pod's allocation arrives in RDMAVISOR_SOCKET.
"""

import argparse
import datetime
import json
import re
import signal
import sys
import threading
import time

import rdmavisor


def fail(msg):
    print(f"echo: {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def duration(s):
    """Parses a Go duration of one or more number-unit pairs: 90s, 2m, 1m30s, 500ms."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", s)
    if not parts or "".join(n + u for n, u in parts) != s:
        raise argparse.ArgumentTypeError(f"invalid duration {s!r}: want e.g. 90s, 2m, 1m30s")
    return sum(float(n) * units[u] for n, u in parts)


def show(path):
    """Prints a file this program wrote (--verdict, --ready): what a probe reads."""
    try:
        with open(path) as f:
            data = f.read()
    except OSError as e:
        fail(f"show {path}: nothing written yet ({e})")
    if not data:
        fail(f"show {path}: nothing written yet")
    print(data)


def serve(client, port, ready, stop):
    with client.listen(port) as ln:
        print(f"echo: listening on {ln.address}", file=sys.stderr, flush=True)
        if ready:
            with open(ready, "w") as f:
                json.dump({"listening": ln.address}, f)
        while not stop.is_set():
            try:
                v = ln.accept(timeout=0.5)
            except TimeoutError:
                continue
            threading.Thread(target=echo, args=(v,), daemon=True).start()


def echo(v):
    """Sends back every message until the peer closes."""
    n, err = 0, None
    try:
        with v:
            while (m := v.recv_message()) is not None:
                v.send_message(m.data)
                n += 1
    except OSError as e:
        err = e
    print(f"echo: vconn from {v.remote_address}: echoed {n} messages ({err})", file=sys.stderr, flush=True)


class Counts:
    """The client's messages: sent, and delivered (echoed back intact, in order)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.sent = 0
        self.delivered = 0

    def add(self, sent=0, delivered=0):
        with self.lock:
            self.sent += sent
            self.delivered += delivered


def fill(pattern, vid, seq, size):
    """Message seq of vconn vid: byte i is (vid*131 + seq*7 + i) mod 256, as the Go client's."""
    start = (vid * 131 + seq * 7) % 256
    return pattern[start:start + size]


def dial(client, addr, deadline):
    """Retries while nothing listens at addr yet or its name or pod IP is not known yet."""
    while True:
        try:
            return client.dial(addr, timeout=max(deadline - time.monotonic(), 0.1))
        except (rdmavisor.RefusedError, rdmavisor.UnknownHostError, rdmavisor.UnreachableError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def exchange(client, addr, vid, n, size, pattern, counts, deadline):
    with dial(client, addr, deadline) as v:
        v.settimeout(max(deadline - time.monotonic(), 0.1))
        for seq in range(n):
            msg = fill(pattern, vid, seq, size)
            try:
                v.send_message(msg)
            except OSError as e:
                raise RuntimeError(f"vconn {vid}: send {seq}: {e}") from e
            counts.add(sent=1)
            try:
                m = v.recv_message()
            except OSError as e:
                raise RuntimeError(f"vconn {vid}: receive {seq}: {e}") from e
            if m is None:
                raise RuntimeError(f"vconn {vid}: receive {seq}: the server closed the vconn")
            if len(m.data) != size:
                raise RuntimeError(f"vconn {vid}: message {seq}: {len(m.data)} bytes back, sent {size}")
            if m.data != msg:
                i = next(i for i in range(size) if m.data[i] != msg[i])
                raise RuntimeError(f"vconn {vid}: message {seq}: byte {i} is {m.data[i]:#x}, sent {msg[i]:#x}")
            counts.add(delivered=1)


def run_client(client, a, counts):
    if not a.addr:
        raise RuntimeError("--addr is required")
    start = time.monotonic()
    deadline = start + a.timeout
    pattern = bytes(range(256)) * (a.size // 256 + 2)
    errors = []

    def one(vid):
        try:
            exchange(client, a.addr, vid, a.messages, a.size, pattern, counts, deadline)
        except Exception as e:  # every failure is the verdict's
            errors.append(e)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(a.conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    d = time.monotonic() - start
    total = a.conns * a.messages
    return (f"echo: OK {a.conns} vconns, {total} messages of {a.size} bytes checked in "
            f"{d * 1000:.0f}ms ({total / d:.0f} round trips/s)")


def write_verdict(path, err, counts):
    at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    v = {"ok": err is None, "at": at, "sent": counts.sent, "delivered": counts.delivered}
    if err is not None:
        v["error"] = str(err)
    try:
        with open(path, "w") as f:
            json.dump(v, f)
    except OSError as e:
        print(f"echo: writing the verdict to {path}: {e}", file=sys.stderr)


def main(argv):
    if len(argv) >= 1 and argv[0] == "show":
        if len(argv) != 2:
            fail("usage: echo show FILE")
        show(argv[1])
        return
    p = argparse.ArgumentParser(prog="echo")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("server")
    s.add_argument("--port", type=int, default=7000)
    s.add_argument("--ready", default="", help="once listening, write the address here as JSON")
    c = sub.add_parser("client")
    c.add_argument("--addr", default="")
    c.add_argument("--conns", type=int, default=2)
    c.add_argument("--messages", type=int, default=1000)
    c.add_argument("--size", type=int, default=4096)
    c.add_argument("--timeout", type=duration, default=120.0)
    c.add_argument("--hold", action="store_true", help="after success, keep running until stopped")
    c.add_argument("--verdict", default="", help="write the outcome here as JSON")
    a = p.parse_args(argv)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        client = rdmavisor.Client()
    except OSError as e:
        fail(e)
    with client:
        if a.cmd == "server":
            try:
                serve(client, a.port, a.ready, stop)
            except OSError as e:
                fail(e)
            return
        counts = Counts()
        try:
            summary, err = run_client(client, a, counts), None
        except Exception as e:
            summary, err = "", e
        if a.verdict:
            write_verdict(a.verdict, err, counts)
        if err is not None:
            fail(err)
        print(summary, flush=True)
        if a.hold:
            while not stop.wait(1):
                pass


if __name__ == "__main__":
    main(sys.argv[1:])
