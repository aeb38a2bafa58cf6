"""A vconn whose transport may lose messages (ud): messages only."""

import pytest

import rdmavisor

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
