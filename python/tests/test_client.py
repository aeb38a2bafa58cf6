"""The client against a fake agent that misbehaves, and the decoder against
random input: the client fails with a clear error, never hangs or crashes."""

import os
import random
import socket
import struct
import threading

import pytest

import rdmavisor
from rdmavisor import _frame as fr


def hello_ok(req, payload=None):
    if payload is None:
        payload = struct.pack(">III", 4, 16, 65536) + b"fake-node"
    return fr.encode(fr.Frame(fr.OP_OK, req=req, arg=fr.VERSION, payload=payload))


class FakeAgent:
    """A unix SOCK_SEQPACKET listener whose answers a test scripts: script
    gets each request frame and returns the datagrams to send back."""

    def __init__(self, tmp_path, script):
        self.path = str(tmp_path / "agent.sock")
        self._l = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._l.bind(self.path)
        self._l.listen(1)
        self._script = script
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self):
        c, _ = self._l.accept()
        with c:
            while True:
                b = c.recv(fr.MAX_FRAME)
                if not b:
                    return
                for out in self._script(fr.decode(b)):
                    if out is None:
                        return
                    c.send(out)

    def close(self):
        self._l.close()


def test_bad_hello_payload(tmp_path):
    agent = FakeAgent(tmp_path, lambda f: [hello_ok(f.req, payload=b"short")])
    with pytest.raises(rdmavisor.AgentGoneError, match="hello info of 5 bytes"):
        rdmavisor.Client(agent.path, timeout=10)
    agent.close()


def test_agent_sends_a_malformed_frame(tmp_path):
    def script(f):
        if f.op == fr.OP_HELLO:
            return [hello_ok(f.req)]
        return [b"\x09" + bytes(27)]  # version 9

    agent = FakeAgent(tmp_path, script)
    c = rdmavisor.Client(agent.path, timeout=10)
    assert c.node == "fake-node" and c.quota == 4
    with pytest.raises(rdmavisor.AgentGoneError, match="protocol error: frame: unsupported version 9"):
        c.dial("node-b:1")
    agent.close()


def test_unknown_error_code_keeps_its_number(tmp_path):
    def script(f):
        if f.op == fr.OP_HELLO:
            return [hello_ok(f.req)]
        return [fr.encode(fr.Frame(fr.OP_ERROR, req=f.req, arg=77, payload=b"from the future"))]

    agent = FakeAgent(tmp_path, script)
    c = rdmavisor.Client(agent.path, timeout=10)
    with pytest.raises(rdmavisor.VConnError, match="code 77: from the future") as e:
        c.dial("node-b:1")
    assert e.value.code == 77
    c.close()
    agent.close()


def test_agent_that_never_answers(tmp_path):
    agent = FakeAgent(tmp_path, lambda f: [])
    with pytest.raises(rdmavisor.DeadlineExceeded, match="hello"):
        rdmavisor.Client(agent.path, timeout=0.05)
    agent.close()


def test_agent_that_hangs_up(tmp_path):
    def script(f):
        if f.op == fr.OP_HELLO:
            return [hello_ok(f.req)]
        return [None]

    agent = FakeAgent(tmp_path, script)
    c = rdmavisor.Client(agent.path, timeout=10)
    with pytest.raises(rdmavisor.AgentGoneError, match="closed the connection"):
        c.dial("node-b:1")
    agent.close()


def test_decode_random_input():
    """Every datagram either decodes to a frame that encodes back to it, or
    is refused with FrameError: the Go fuzz target's property."""
    rnd = random.Random(24)
    valid = [fr.encode(fr.Frame(op, flags, 1, 2, 3, 4, os.urandom(n)))
             for op in range(1, 19) for flags in (0, 1) for n in (0, 1, 100)]
    for i in range(20000):
        if i % 2:
            b = bytearray(rnd.choice(valid))
            for _ in range(rnd.randint(1, 4)):
                b[rnd.randrange(len(b))] = rnd.randrange(256)
            if rnd.random() < 0.2:
                b = b[: rnd.randrange(len(b) + 1)]
        else:
            b = bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 40)))
        try:
            f = fr.decode(bytes(b))
        except fr.FrameError:
            continue
        assert fr.encode(f) == bytes(b)


def test_hello_reply_of_another_version(tmp_path):
    def script(f):
        return [fr.encode(fr.Frame(fr.OP_OK, req=f.req, arg=2, payload=struct.pack(">III", 4, 16, 65536)))]

    agent = FakeAgent(tmp_path, script)
    with pytest.raises(rdmavisor.AgentGoneError, match="protocol version 2, this client speaks 1"):
        rdmavisor.Client(agent.path, timeout=10)
    agent.close()


def test_operations_the_agent_drops_at_close_fail(tmp_path, monkeypatch):
    """The agent never answers operations still queued when Close comes:
    their callers get ClosedError instead of waiting forever."""
    monkeypatch.setattr(rdmavisor._conn, "CLOSE_TIMEOUT", 0.05)  # the drain before Close
    exports = threading.Event()

    def script(f):
        if f.op == fr.OP_HELLO:
            return [hello_ok(f.req)]
        if f.op == fr.OP_DIAL:
            return [fr.encode(fr.Frame(fr.OP_OK, req=f.req, handle=1, arg2=1 << 32 | 65536, payload=f.payload))]
        if f.op == fr.OP_EXPORT:
            exports.set()
            return []  # queued behind something slow, as it were
        if f.op == fr.OP_CLOSE:
            return [fr.encode(fr.Frame(fr.OP_OK, req=f.req, handle=f.handle))]
        return []

    agent = FakeAgent(tmp_path, script)
    c = rdmavisor.Client(agent.path, timeout=10)
    v = c.dial("node-b:1")
    got = []
    t = threading.Thread(target=lambda: got.append(pytest.raises(rdmavisor.ClosedError, v.export, 4096)))
    t.start()
    assert exports.wait(10)
    v.close()
    t.join(10)
    assert not t.is_alive() and "closed before the agent ran" in str(got[0].value)
    c.close()
    agent.close()
