"""Streams, messages, regions and deadlines against two real agents."""

import os
import threading

import pytest

import rdmavisor


def test_hello_says_quota_and_node(agents):
    with agents.client("node-a", k=5) as c:
        assert c.quota == 5
        assert c.node == "node-a"
        assert c.send_window > 0
        assert c.max_message > 0


def test_echo_stream(agents, echo_server):
    data = os.urandom(3 << 20)  # many messages of max_message
    with agents.client("node-a") as c, c.dial(echo_server) as v:
        assert v.transport == "rc"
        got = bytearray()
        # Send and read in turns, so that neither side waits on the other's window.
        for i in range(0, len(data), 256 << 10):
            v.sendall(data[i:i + (256 << 10)])
            got += v.recv_exactly(min(256 << 10, len(data) - i), timeout=30)
        assert got == data


def test_end_of_stream(pair):
    c, s = pair
    c.sendall(b"last words")
    c.close()
    assert s.recv_exactly(10, timeout=10) == b"last words"
    assert s.recv(10, timeout=10) == b""
    assert s.recv_message(timeout=10) is None
    with pytest.raises(rdmavisor.ClosedError):
        c.sendall(b"after close")


def test_messages_keep_boundaries_and_immediates(pair):
    c, s = pair
    sent = [(b"", None), (b"a", 0), (b"bb", 0xFFFFFFFF), (os.urandom(c.max_message), 7), (b"ccc", None)]
    for data, imm in sent:
        c.send_message(data, imm)
    for data, imm in sent:
        m = s.recv_message(timeout=10)
        assert m == rdmavisor.Message(data, imm)


def test_message_too_large_is_refused_before_sending(pair):
    c, s = pair
    with pytest.raises(rdmavisor.TooLargeError, match="at most"):
        c.send_message(bytes(c.max_message + 1))
    c.send_message(b"still fine")
    assert s.recv_message(timeout=10).data == b"still fine"


def test_recv_into(pair):
    c, s = pair
    c.sendall(b"0123456789")
    buf = bytearray(4)
    assert s.recv_into(buf, timeout=10) == 4
    assert buf == b"0123"
    assert s.recv_exactly(6, timeout=10) == b"456789"


def test_deadlines(pair):
    c, s = pair
    s.settimeout(0.05)
    with pytest.raises(rdmavisor.DeadlineExceeded) as e:
        s.recv(1)
    assert isinstance(e.value, TimeoutError)
    with pytest.raises(TimeoutError):
        s.recv_message()
    s.setblocking(False)
    with pytest.raises(BlockingIOError):
        s.recv(1)
    # A deadline passed leaves the vconn usable.
    s.settimeout(None)
    c.sendall(b"x")
    assert s.recv(1, timeout=10) == b"x"


def test_accept_deadline(agents, port):
    with agents.client("node-b") as b, b.listen(port) as ln:
        with pytest.raises(TimeoutError):
            ln.accept(timeout=0.05)
        ln.settimeout(0)
        with pytest.raises(BlockingIOError):
            ln.accept()


def test_a_sender_the_peer_does_not_read_blocks_until_it_reads(pair):
    """Flow control: the agent pushes only what the reader granted and the
    engine's credits hold the sender back; a send timeout says so."""
    c, s = pair
    msg = bytes(1024)
    sent = 0
    with pytest.raises(rdmavisor.DeadlineExceeded):
        for _ in range(100000):
            c.send_message(msg, timeout=2)
            sent += 1
    assert 0 < sent < 100000
    for _ in range(sent):
        assert s.recv_message(timeout=30).data == msg
    c.send_message(b"after", timeout=30)
    assert s.recv_message(timeout=30).data == b"after"


def test_threads_share_a_vconn(pair):
    c, s = pair
    n, per = 4, 200

    def send(k):
        for i in range(per):
            c.send_message(b"%d:%d" % (k, i))

    ts = [threading.Thread(target=send, args=(k,)) for k in range(n)]
    for t in ts:
        t.start()
    got = [s.recv_message(timeout=30).data for _ in range(n * per)]
    for t in ts:
        t.join()
    for k in range(n):  # each thread's messages in its order
        assert [g for g in got if g.startswith(b"%d:" % k)] == [b"%d:%d" % (k, i) for i in range(per)]


def test_regions(pair):
    c, s = pair
    r = s.export(200 << 10, rdmavisor.ACCESS_READ | rdmavisor.ACCESS_WRITE)
    assert r.size == 200 << 10
    # The export reaches the peer before a message sent after it: the id
    # travels so, as an application's would.
    s.send_message(b"region", imm=r.id)
    assert c.recv_message(timeout=10) == rdmavisor.Message(b"region", r.id)
    data = os.urandom(150 << 10)  # more than a frame's payload: several operations
    r.write(1000, data)
    assert r.read(1000, len(data)) == data
    assert c.read_region(r.id, 1000, len(data)) == data
    c.write_region(r.id, 0, b"written by the peer")
    assert r.read(0, 19) == b"written by the peer"
    with pytest.raises(rdmavisor.RegionError):
        c.read_region(r.id, r.size - 1, 2)
    with pytest.raises(rdmavisor.RegionError):
        r.read(r.size + 1, 1)
    with pytest.raises(rdmavisor.RegionError):
        c.read_region(r.id + 1000, 0, 1)
    r.close()
    # Errors leave the vconn usable.
    c.send_message(b"after regions")
    assert s.recv_message(timeout=10).data == b"after regions"


def test_read_only_region_refuses_writes(pair):
    c, s = pair
    r = s.export(4096, rdmavisor.ACCESS_READ)
    r.write(0, b"mine")
    s.send_message(b"", imm=r.id)
    assert c.recv_message(timeout=10).imm == r.id
    assert c.read_region(r.id, 0, 4) == b"mine"
    with pytest.raises(rdmavisor.RegionError):
        c.write_region(r.id, 0, b"theirs")
    assert r.read(0, 4) == b"mine"


def test_fileno_polls_readable_while_recv_would_not_wait(agents, port):
    import selectors

    with agents.client("node-b") as b, agents.client("node-a") as a, b.listen(port) as ln:
        sel = selectors.DefaultSelector()
        sel.register(ln, selectors.EVENT_READ, "listener")
        assert sel.select(0) == []
        c1 = a.dial(f"node-b:{port}")
        assert [k.data for k, _ in sel.select(10)] == ["listener"]
        s1 = ln.accept(timeout=0)
        assert sel.select(0) == []
        c2 = a.dial(f"node-b:{port}")
        sel.select(10)
        s2 = ln.accept(timeout=0)
        sel.register(s1, selectors.EVENT_READ, "s1")
        sel.register(s2, selectors.EVENT_READ, "s2")
        assert sel.select(0) == []
        c2.sendall(b"abcdef")
        assert [k.data for k, _ in sel.select(10)] == ["s2"]
        assert s2.recv(2, timeout=0) == b"ab"  # the rest of the message keeps it readable
        assert [k.data for k, _ in sel.select(0)] == ["s2"]
        assert s2.recv(10, timeout=0) == b"cdef"
        assert sel.select(0) == []
        c1.close()  # the end of the stream is readable
        assert [k.data for k, _ in sel.select(10)] == ["s1"]
        assert s1.recv(1, timeout=0) == b""
        sel.unregister(s1)
        s1.close()
        assert s1.fileno() == -1
        sel.close()
        for x in (c2, s2):
            x.close()
