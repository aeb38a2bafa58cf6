"""Replies a broken or hostile agent may send (issue 33, finding 5): text
that is not UTF-8, region reads that carry no bytes or other than the
count asked for, and random or mutated frames. Each surfaces as the
package's error (AgentGoneError, "protocol error", for a reply that breaks
the protocol: the session is closed, and the next call connects again),
never as a bare UnicodeDecodeError, a loop or more bytes than asked."""

import random
import socket
import struct
import threading

import pytest
from conftest import listen_seqpacket

import rdmavisor
from rdmavisor import _frame as fr
from rdmavisor._session import error_of

INFO = struct.pack(">III", 4, 16, 65536) + b"fake"


class FakeAgent:
    """An agent on a socket of its own: it answers Hello and Dial (handle
    1, rc), ignores Grant, and hands every other request to answer, which
    returns the frames to send back. It serves connections one after
    another and counts them."""

    def __init__(self, path, answer, info):
        self.answer, self.info = answer, info
        self.sessions = 0
        self._srv, self._t = listen_seqpacket(path, self._serve)
        self._t.start()

    def _serve(self):
        while True:
            try:
                conn, _ = self._srv.accept()
            except OSError:
                return
            self.sessions += 1
            with conn:
                self._session(conn)

    def _session(self, conn):
        while True:
            try:
                b = conn.recv(fr.MAX_FRAME + 1)
            except OSError:
                return
            if not b:
                return
            f = fr.decode(b)
            if f.op == fr.OP_HELLO:
                out = [fr.Frame(fr.OP_OK, req=f.req, arg=fr.VERSION, payload=self.info)]
            elif f.op == fr.OP_DIAL:
                out = [fr.Frame(fr.OP_OK, req=f.req, handle=1, arg2=1 << 32 | 65536)]
            elif f.op == fr.OP_GRANT:
                out = []
            else:
                out = self.answer(f, self.sessions)
            try:
                for x in out:
                    conn.send(x if isinstance(x, bytes) else fr.encode(x))
            except OSError:
                return

    def close(self):
        self._srv.shutdown(socket.SHUT_RDWR)
        self._srv.close()
        self._t.join(10)


@pytest.fixture
def fake(tmp_path):
    agents = []

    def start(answer, info=INFO):
        path = str(tmp_path / f"fake{len(agents)}.sock")
        agents.append(FakeAgent(path, answer, info))
        return agents[-1], path

    yield start
    for a in agents:
        a.close()


def ok(f, **kw):
    return fr.Frame(fr.OP_OK, req=f.req, **{"handle": f.handle, **kw})


def test_listen_address_not_utf8_is_a_protocol_error(fake):
    """The address a Listen's reply names: bad bytes break the session
    (AgentGoneError), the next listen connects again and works."""

    def answer(f, session):
        if f.op == fr.OP_LISTEN:
            addr = b"\xff\xfe:80" if session == 1 else b"10.0.0.1:80"
            return [ok(f, handle=7, payload=addr)]
        return [ok(f)]

    agent, path = fake(answer)
    with rdmavisor.Client(path, timeout=5) as c:
        first = c._session()
        with pytest.raises(rdmavisor.AgentGoneError, match="protocol error: listen 80: the address bound: not UTF-8"):
            c.listen(80)
        assert not first.alive()
        ln = c.listen(80)
        assert ln.address == "10.0.0.1:80"
        assert agent.sessions == 2


@pytest.mark.parametrize("where", ["error message", "hello node", "accepted peer"])
def test_messages_not_utf8_decode_with_replacement(fake, where):
    """Text that is only a message or a name shown to the user is decoded
    with errors="replace": the call fails (or succeeds) as it would with
    good bytes, and the session stays."""
    bad = b"\xff\xfebad\xc3"

    def answer(f, session):
        if f.op == fr.OP_LISTEN:
            return [ok(f, handle=7, payload=b"10.0.0.1:80")]
        if f.op == fr.OP_UNEXPORT:  # the test's cue: the listener is registered
            return [fr.Frame(fr.OP_ACCEPT, handle=7, arg=2, arg2=1 << 32 | 65536, payload=bad)]
        return [fr.Frame(fr.OP_ERROR, req=f.req, handle=f.handle, arg=rdmavisor.errors.CODE_REGION, payload=bad)]

    agent, path = fake(answer, INFO[:12] + bad if where == "hello node" else INFO)
    with rdmavisor.Client(path, timeout=5) as c:
        if where == "error message":
            v = c.dial("node-b:1")
            with pytest.raises(rdmavisor.RegionError, match="\ufffd\ufffdbad"):
                v.export(64)
        elif where == "hello node":
            assert c.node == "\ufffd\ufffdbad\ufffd"
        else:
            ln = c.listen(80)
            c._session().write(fr.Frame(fr.OP_UNEXPORT))
            v = ln.accept(timeout=5)
            assert v.remote_address == "\ufffd\ufffdbad\ufffd"
        assert c._session().alive()
        assert agent.sessions == 1


@pytest.mark.parametrize("payload", [b"", b"x" * 5, b"x" * 20], ids=["empty", "short", "longer"])
@pytest.mark.parametrize("op", ["read_region", "Region.read"])
def test_region_read_reply_of_another_length_is_a_protocol_error(fake, op, payload):
    """A Read or LocalRead of 10 bytes answered with 0 (which had the
    client ask again forever), 5 or 20 (which it returned, more than asked)
    bytes: AgentGoneError, the vconn fails with it, and the next dial
    connects again; libvconn checks the same (copy_in)."""

    def answer(f, session):
        if f.op == fr.OP_EXPORT:
            return [ok(f, arg=3)]
        if f.op in (fr.OP_READ, fr.OP_LOCAL_READ):
            return [ok(f, payload=payload if session == 1 else b"0123456789")]
        return [ok(f)]

    agent, path = fake(answer)
    with rdmavisor.Client(path, timeout=5) as c:
        v = c.dial("node-b:1")
        read = (lambda v: v.read_region(3, 0, 10)) if op == "read_region" else (lambda v: v.export(64).read(0, 10))
        result = []
        t = threading.Thread(target=lambda: result.append(_outcome(read, v)), daemon=True)
        t.start()
        t.join(10)
        assert not t.is_alive(), f"{op} of 10 bytes answered with {len(payload)}: still reading after 10 s"
        (err,) = result
        assert isinstance(err, rdmavisor.AgentGoneError), err
        assert f"the agent returned {len(payload)} bytes of 10" in str(err)
        assert isinstance(v.error, rdmavisor.AgentGoneError)
        w = c.dial("node-b:1")
        assert read(w) == b"0123456789"
        assert agent.sessions == 2


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as e:  # the test asserts which
        return e


def _mutate(rng, b):
    b = bytearray(b)
    for _ in range(rng.randint(1, 4)):
        how = rng.randrange(5)
        if how == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif how == 1:
            del b[rng.randrange(len(b) + 1):]
        elif how == 2:
            b += rng.randbytes(rng.randint(1, 64))
        elif how == 3 and len(b) >= fr.HEADER_LEN:
            b[24:28] = struct.pack(">I", rng.choice([0, len(b) - fr.HEADER_LEN + 1, fr.MAX_PAYLOAD + 1, 0xFFFFFFFF]))
        else:
            b = bytearray(rng.randbytes(rng.randint(0, 80)))
    return bytes(b)


def test_random_and_mutated_frames_raise_only_frame_errors():
    """5,000 datagrams (seed 33): frames of every op with random fields and
    payloads, mutated (bytes changed, cut, extended, the length field
    wrong) or replaced by random bytes. decode returns a frame or raises
    FrameError; what the client reads from a frame (error_of, the hello
    info, the vconn info) raises nothing else."""
    rng = random.Random(33)
    decoded = refused = 0
    for _ in range(5000):
        f = fr.Frame(rng.randrange(1, fr._OP_LIMIT), rng.choice([0, fr.FLAG_IMM]), rng.getrandbits(32),
                     rng.getrandbits(32), rng.getrandbits(32), rng.getrandbits(64), rng.randbytes(rng.randint(0, 40)))
        b = fr.encode(f)
        if rng.random() < 0.8:
            b = _mutate(rng, b)
        try:
            g = fr.decode(b)
        except fr.FrameError:
            refused += 1
            continue
        decoded += 1
        err = error_of(g)
        assert err is None or isinstance(err, rdmavisor.VConnError)
        fr.vconn_info(g.arg2)
        try:
            fr.decode_hello(g.payload)
        except fr.FrameError:
            pass
    assert decoded > 500 and refused > 500, (decoded, refused)
