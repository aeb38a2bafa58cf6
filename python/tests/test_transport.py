"""A vconn whose transport may lose messages (ud): messages only."""

import socket

import pytest

import rdmavisor
from rdmavisor import _frame as fr

from conftest import Agents


@pytest.fixture(scope="module")
def ud_agents():
    a = Agents("-transport", "ud")
    yield a
    a.close()


def test_ud_vconn_carries_messages_not_streams(ud_agents, port):
    with ud_agents.client("node-b") as b, ud_agents.client("node-a") as a, b.listen(port) as ln:
        c = a.dial(f"node-b:{port}")
        s = ln.accept(timeout=10)
        assert c.transport == s.transport == "ud"
        assert 0 < c.max_message < a.max_message  # one MTU, less the engine's header
        with pytest.raises(rdmavisor.NotStreamError, match="use send_message"):
            c.sendall(b"stream")
        with pytest.raises(rdmavisor.NotStreamError):
            s.recv(1)
        with pytest.raises(rdmavisor.TooLargeError, match="on this ud vconn"):
            c.send_message(bytes(c.max_message + 1))
        # A datagram may be lost: send until one arrives.
        m = None
        for _ in range(20):
            c.send_message(b"datagram", imm=9)
            try:
                m = s.recv_message(timeout=1)
                break
            except TimeoutError:
                continue
        assert m == rdmavisor.Message(b"datagram", 9)
        c.close()
        s.close()


def test_bridged_dial_on_ud_reaches_no_listener(ud_agents, port):
    """A byte stream cannot ride ud: the agent refuses a bridged Dial (and
    Listen) with BadRequest before any listener hears of it (R8.20); this
    package's listener accepts nothing, and its session goes on."""
    with ud_agents.client("node-b") as b, b.listen(port) as ln:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        raw.settimeout(10)
        try:
            raw.connect(ud_agents.alloc("node-a"))
            raw.send(fr.encode(fr.Frame(fr.OP_HELLO, req=1, arg=fr.VERSION)))
            assert fr.decode(raw.recv(fr.MAX_FRAME + 1)).op == fr.OP_OK
            for req, f in ((2, fr.Frame(fr.OP_DIAL, flags=2, req=2, payload=f"node-b:{port}".encode())),
                           (3, fr.Frame(fr.OP_LISTEN, flags=2, req=3, arg=port + 1000))):
                raw.send(fr.encode(f))
                rep = fr.decode(raw.recv(fr.MAX_FRAME + 1))
                assert (rep.op, rep.req, rep.arg) == (fr.OP_ERROR, req, rdmavisor.errors.CODE_BAD_REQUEST), rep
            with pytest.raises(TimeoutError):
                ln.accept(timeout=1)
            with ud_agents.client("node-a") as a, a.dial(f"node-b:{port}") as c:  # a plain dial is accepted
                with ln.accept(timeout=10) as s:
                    assert c.transport == s.transport == "ud"
        finally:
            raw.close()
