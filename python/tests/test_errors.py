"""Errors: each protocol code as its exception, malformed frames, quota."""

import socket
import struct
import threading

import pytest

import rdmavisor
from rdmavisor import _frame as fr


def test_dial_refused(agents, port):
    with agents.client("node-a") as c:
        with pytest.raises(rdmavisor.RefusedError, match=f"nothing listens on port {port}") as e:
            c.dial(f"node-b:{port}")
        assert isinstance(e.value, ConnectionRefusedError)
        assert e.value.code == 5


def test_listen_address_in_use(agents, port):
    with agents.client("node-b") as a, agents.client("node-b") as b:
        with a.listen(f":{port}"):
            with pytest.raises(rdmavisor.AddrInUseError, match="already has a listener"):
                b.listen(port)
        with b.listen(port):  # free again once closed
            pass


@pytest.mark.parametrize("addr", ["node-b", "node-b:0", "node-b:65536", ":7000", "node-b:http", "a:b:1"])
def test_bad_addresses(agents, addr):
    with agents.client("node-a") as c:
        with pytest.raises(rdmavisor.BadRequestError):
            c.dial(addr)


def test_unknown_host_is_resolved(agents, echo_server, monkeypatch):
    """A name the agent does not know is resolved and dialled by IP."""
    port = int(echo_server.rsplit(":", 1)[1])
    ips = {"echo.test": "127.0.0.3"}

    def getaddrinfo(host, *a, **k):
        if host not in ips:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ips[host], 0))]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    with agents.client("node-a") as c:
        with c.dial(f"echo.test:{port}") as v:
            v.sendall(b"resolved")
            assert v.recv_exactly(8, timeout=10) == b"resolved"
        with pytest.raises(rdmavisor.UnknownHostError, match="no-such.test"):
            c.dial(f"no-such.test:{port}")


def test_quota(agents, echo_server):
    with agents.client("node-a", k=2) as c:
        assert c.quota == 2
        v1 = c.dial(echo_server)
        v2 = c.dial(echo_server)
        with pytest.raises(rdmavisor.QuotaError, match="all its 2 vconns in use"):
            c.dial(echo_server)
        v1.close()
        v3 = c.dial(echo_server)  # the closed vconn's slot
        v3.sendall(b"q")
        assert v3.recv(1, timeout=10) == b"q"
        v2.close()
        v3.close()


def test_every_code_has_its_exception():
    for code in range(1, 19):
        e = rdmavisor.from_code(code, "m")
        assert type(e) is not rdmavisor.VConnError and e.code == code and "m" in str(e)
    e = rdmavisor.from_code(99, "future")
    assert type(e) is rdmavisor.VConnError and e.code == 99 and "code 99" in str(e)


def header(version=1, op=fr.OP_HELLO, flags=0, length=0, payload=b""):
    return struct.pack(">BBHIIIQI", version, op, flags, 0, 0, 0, 0, length) + payload


@pytest.mark.parametrize("raw, exc, why", [
    (header(op=99), rdmavisor.BadRequestError, "unknown op 99"),
    (header(version=7), rdmavisor.BadRequestError, "unsupported version 7"),
    (header(flags=0x80), rdmavisor.BadRequestError, "unknown flags"),
    (header(length=5, payload=b"abc"), rdmavisor.BadRequestError, "length does not match"),
    (header(op=fr.OP_DATA), rdmavisor.BadRequestError, "data is not a request"),
    (header(length=fr.MAX_PAYLOAD + 1, payload=bytes(fr.MAX_PAYLOAD + 1)), rdmavisor.BadRequestError,
     "larger than MaxPayload"),
    (b"\x01\x02\x03", rdmavisor.AgentGoneError, "shorter than its header"),
], ids=["op", "version", "flags", "length", "push-op", "too-big", "short"])
def test_malformed_frame_gets_a_clear_error_and_the_agent_is_fine(agents, echo_server, raw, exc, why):
    sock = agents.alloc("node-a")
    bad = rdmavisor.Client(sock)
    other = rdmavisor.Client(sock)  # the same allocation, another connection
    v = other.dial(echo_server)
    with pytest.raises(exc, match=why):
        bad._send_raw(raw)
    # The agent hung up on the bad connection only.
    v.sendall(b"unaffected")
    assert v.recv_exactly(10, timeout=10) == b"unaffected"
    with agents.client("node-a") as third, third.dial(echo_server) as w:
        w.sendall(b"new")
        assert w.recv_exactly(3, timeout=10) == b"new"
    # The bad client connects again on its next dial.
    with bad.dial(echo_server) as w:
        w.sendall(b"again")
        assert w.recv_exactly(5, timeout=10) == b"again"
    v.close()
    bad.close()
    other.close()


def test_vconns_fail_when_their_connection_breaks(agents, echo_server):
    c = agents.client("node-a")
    v = c.dial(echo_server)
    with pytest.raises(rdmavisor.BadRequestError):
        c._send_raw(header(op=99))
    with pytest.raises(rdmavisor.AgentGoneError, match="closed the connection"):
        v.recv(1, timeout=10)
    with pytest.raises(rdmavisor.AgentGoneError):
        v.sendall(b"x")
    c.close()


def test_missing_socket(monkeypatch, tmp_path):
    monkeypatch.delenv("RDMAVISOR_SOCKET", raising=False)
    with pytest.raises(rdmavisor.AgentGoneError, match="RDMAVISOR_SOCKET is not set"):
        rdmavisor.Client()
    with pytest.raises(rdmavisor.AgentGoneError, match="cannot connect to the agent: no agent socket at"):
        rdmavisor.Client(str(tmp_path / "nothing.sock"))


def test_closed_client(agents, echo_server):
    c = agents.client("node-a")
    v = c.dial(echo_server)
    c.close()
    with pytest.raises(rdmavisor.ClosedError):
        v.recv(1, timeout=10)
    with pytest.raises(rdmavisor.ClosedError):
        c.dial(echo_server)


def test_sessions_limit(agents):
    """An allocation takes limits.sessions connections (64 by default); the
    next one is told why it is refused."""
    sock = agents.alloc("node-a")
    clients = [rdmavisor.Client(sock) for _ in range(64)]
    with pytest.raises(rdmavisor.LimitError, match=r"limits\.sessions"):
        rdmavisor.Client(sock)
    clients.pop().close()
    # The agent frees the place once it has seen the connection end.
    for _ in range(200):
        try:
            clients.append(rdmavisor.Client(sock))
            break
        except rdmavisor.LimitError:
            threading.Event().wait(0.05)
    assert len(clients) == 64
    for c in clients:
        c.close()
