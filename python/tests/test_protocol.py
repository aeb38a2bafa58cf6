"""The rules of docs/protocol.md that issue 35 clarified, as this package
keeps them: an Error with req 0 and handle 0 ends the session (§3, R8.5,
R8.6); bad arguments get the code of their fault and leave the session as
it was (§8). (R8.20, bridging on ud: test_transport.py.)"""

import socket
import struct
import threading

import pytest

import rdmavisor
from rdmavisor import _frame as fr


def test_error_with_req_0_and_handle_0_ends_the_session(agents, echo_server):
    c = agents.client("node-a")
    v = c.dial(echo_server)
    v.sendall(b"x")
    assert v.recv_exactly(1, timeout=10) == b"x"
    # A Grant on handle 0: the agent ends the session for it.
    c._session().write(fr.Frame(fr.OP_GRANT, handle=0, arg=1))
    with pytest.raises(rdmavisor.AgentGoneError, match="grant on handle 0"):
        v.recv(1, timeout=10)
    with c.dial(echo_server) as w:  # the next dial connects again
        w.sendall(b"again")
        assert w.recv_exactly(5, timeout=10) == b"again"
    c.close()


def test_the_session_ends_at_the_error_not_at_the_close(tmp_path):
    """A fake agent that sends the Error and keeps the connection open."""
    path = str(tmp_path / "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen()
    done = threading.Event()

    def serve():
        conn, _ = srv.accept()
        with conn:
            h = fr.decode(conn.recv(fr.MAX_FRAME + 1))
            info = struct.pack(">III", 4, 16, 65536) + b"fake"
            conn.send(fr.encode(fr.Frame(fr.OP_OK, req=h.req, arg=fr.VERSION, payload=info)))
            d = fr.decode(conn.recv(fr.MAX_FRAME + 1))
            conn.send(fr.encode(fr.Frame(fr.OP_OK, req=d.req, handle=1, arg2=1 << 32 | 65536, payload=d.payload)))
            assert fr.decode(conn.recv(fr.MAX_FRAME + 1)).op == fr.OP_GRANT  # the dial is done
            conn.send(fr.encode(fr.Frame(fr.OP_ERROR, arg=1, payload=b"you lost track")))
            done.wait(10)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        c = rdmavisor.Client(path)
        v = c.dial("node-b:1")
        with pytest.raises(rdmavisor.AgentGoneError, match="you lost track"):
            v.recv(1, timeout=5)
        c.close()
    finally:
        done.set()
        t.join(10)
        srv.close()


@pytest.mark.parametrize("size, access, exc", [
    (0, rdmavisor.ACCESS_READ, rdmavisor.BadRequestError),
    ((1 << 20) + 1, rdmavisor.ACCESS_READ, rdmavisor.TooLargeError),
    (64, 0, rdmavisor.BadRequestError),
    (64, 0x103, rdmavisor.BadRequestError),
], ids=["size-0", "past-max", "access-0", "access-0x103"])
def test_bad_arguments_get_their_code_and_keep_the_session(agents, echo_server, size, access, exc):
    with agents.client("node-a") as c:
        v = c.dial(echo_server)
        s = c._session()
        with pytest.raises(exc):
            v.export(size, access)
        v.sendall(b"still here")
        assert v.recv_exactly(10, timeout=10) == b"still here"
        assert c._session() is s  # the same session
        v.close()
