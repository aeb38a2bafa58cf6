"""Staging memory (issue 32, item 3): a vconn's write_region and
read_region carry their bytes in a memfd shared with the agent, not in
frames, where the agent offers it (FeatureStage); in frames where it does
not, refuses Stage or passes memory that cannot be mapped. Against the
real agents (the bytes end to end, threads, close) and a fake agent that
checks the spans and holds an answer back."""

import fcntl
import mmap
import os
import socket
import struct
import threading

import pytest
from conftest import listen_seqpacket

import rdmavisor
from rdmavisor import _frame as fr
from rdmavisor import _stage
from rdmavisor.errors import CODE_LIMIT

KIB = 1 << 10
# (size, offset): a byte, a page, a slot, more than three slots; none at 0.
SIZES = [(1, 3), (4 * KIB, 4097), (64 * KIB, 12345), (200 * KIB, 70001)]


def spy(conn):
    """Records the frames conn's session sends: (op, flags, payload)."""
    sent, s = [], conn._s
    write = s.write

    def recording(f):
        sent.append((f.op, f.flags, f.payload))
        write(f)

    s.write = recording
    return sent


def spans(sent, op):
    """The staged spans (offset, length) of op's frames; every one of them
    must be staged."""
    got = [(flags, p) for o, flags, p in sent if o == op]
    assert all(flags == fr.FLAG_MEMFD and len(p) == 8 for flags, p in got), got
    return [struct.unpack(">II", p) for _, p in got]


def pieces(n, slot):
    return [min(slot, n - i) for i in range(0, n, slot)]


def exported(pair, size):
    c, s = pair
    r = s.export(size)
    s.send_message(b"", imm=r.id)
    assert c.recv_message(timeout=10).imm == r.id
    return r


def test_staged_bytes_end_to_end(pair):
    """Each size at a non-zero offset: written staged, read back with
    LocalRead (frames, another path); written with LocalWrite, read
    staged. Every Write and Read is staged, in slots of the memory."""
    c, s = pair
    r = exported(pair, 512 * KIB)
    sent = spy(c)
    for n, off in SIZES:
        data = os.urandom(n)
        c.write_region(r.id, off, data, timeout=10)
        assert r.read(off, n) == data, n
        other = os.urandom(n)
        r.write(off, other)
        assert c.read_region(r.id, off, n, timeout=10) == other, n
    st = c._staging.stage
    assert st is not None and st.slot == 64 * KIB
    assert [op for op, _, _ in sent].count(fr.OP_STAGE) == 1
    want = [k for n, _ in SIZES for k in pieces(n, st.slot)]
    for op in (fr.OP_WRITE, fr.OP_READ):
        got = spans(sent, op)
        assert [k for _, k in got] == want
        assert all(at % st.slot == 0 and at < _stage.SIZE for at, _ in got)


def test_staged_threads(pair):
    """Eight threads of one vconn write and read their own areas, each of
    two slots, so that they wait for slots: every byte arrives."""
    c, s = pair
    area = 96 * KIB
    r = exported(pair, 8 * area + 1)
    errors = []

    def run(k):
        try:
            for _ in range(6):
                data = os.urandom(area)
                c.write_region(r.id, 1 + k * area, data, timeout=30)
                assert c.read_region(r.id, 1 + k * area, area, timeout=30) == data
        except BaseException as e:  # noqa: B902 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=run, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors, errors
    assert sorted(c._staging.stage.free) == [i * 64 * KIB for i in range(4)]
    mine = os.urandom(area)
    c.write_region(r.id, 1, mine)
    assert r.read(1, area) == mine


def test_close_unmaps(pair):
    c, s = pair
    r = exported(pair, 4 * KIB)
    c.write_region(r.id, 0, b"staged")
    st = c._staging.stage
    c.close()
    assert st._mm is None
    with pytest.raises(rdmavisor.ClosedError):
        c.write_region(r.id, 0, b"after close")
    assert r.read(0, 6) == b"staged"


class StageAgent:
    """A fake agent of one vconn (handle 1) and one region (id 5) of a MiB,
    whose Stage is as mode says: "staged" (a sealed memfd), "no feature"
    (not offered), "refused" (CodeLimit) or "unsealed" (a memfd the client
    must not map). It records the frames, and holds the answer to a staged
    Write while hold is clear."""

    def __init__(self, path, mode):
        self.mode, self.sent = mode, []
        self.region = bytearray(1 << 20)
        self.hold = threading.Event()
        self.hold.set()
        self.mm = None
        self.conn = None
        self._srv, self._t = listen_seqpacket(path, self._serve)
        self._t.start()

    def _serve(self):
        conn, _ = self._srv.accept()
        self.conn = conn
        with conn:
            while True:
                b = conn.recv(fr.MAX_FRAME + 1)
                if not b:
                    return
                flags = struct.unpack_from(">H", b, 2)[0]  # fr.decode takes only the agent's flags
                f = fr.decode(b[:2] + struct.pack(">H", flags & ~fr.FLAG_MEMFD) + b[4:])._replace(flags=flags)
                self.sent.append(f)
                out, fds = self._answer(f)
                if out is not None:
                    socket.send_fds(conn, [fr.encode(out._replace(req=f.req, handle=f.handle))], fds)
                for fd in fds:
                    os.close(fd)

    def _answer(self, f):
        ok = fr.Frame(fr.OP_OK)
        if f.op == fr.OP_HELLO:
            features = 0 if self.mode == "no feature" else fr.FEATURE_STAGE
            return ok._replace(arg=fr.VERSION, arg2=features,
                               payload=struct.pack(">III", 4, 16, 65536) + b"fake"), []
        if f.op == fr.OP_DIAL:
            return ok._replace(handle=1, arg2=1 << 32 | 65536), []
        if f.op == fr.OP_GRANT:
            return None, []
        if f.op == fr.OP_STAGE:
            return self._stage(f)
        if f.op in (fr.OP_WRITE, fr.OP_READ):
            return self._one_sided(f), []
        return ok, []

    def _stage(self, f):
        if self.mode == "refused":
            return fr.Frame(fr.OP_ERROR, arg=CODE_LIMIT, payload=b"limits.regionBytes"), []
        fd = os.memfd_create("fake-stage", os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, f.arg2)
        if self.mode == "staged":
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        self.mm = mmap.mmap(fd, f.arg2)
        return fr.Frame(fr.OP_OK, arg2=f.arg2), [fd]

    def _one_sided(self, f):
        off = f.arg2
        if f.flags & fr.FLAG_MEMFD:
            at, n = struct.unpack(">II", f.payload)
            assert at + n <= len(self.mm)
            if f.op == fr.OP_READ:
                self.mm[at:at + n] = self.region[off:off + n]
                return fr.Frame(fr.OP_OK)
            self.hold.wait(30)
            self.region[off:off + n] = self.mm[at:at + n]
            return fr.Frame(fr.OP_OK)
        if f.op == fr.OP_READ:
            (n,) = struct.unpack(">I", f.payload)
            return fr.Frame(fr.OP_OK, payload=bytes(self.region[off:off + n]))
        self.region[off:off + len(f.payload)] = f.payload
        return fr.Frame(fr.OP_OK)

    def close(self):
        self._srv.close()
        self._t.join(10)


@pytest.fixture
def stage_agent(tmp_path):
    made = []

    def start(mode):
        path = str(tmp_path / "fake.sock")
        made.append(StageAgent(path, mode))
        c = rdmavisor.Client(path, timeout=10)
        made.append(c)
        return made[0], c.dial("fake:1")

    yield start
    for x in reversed(made):
        x.close()


@pytest.mark.parametrize("mode", ["staged", "no feature", "refused", "unsealed"])
def test_staged_or_in_frames(stage_agent, mode):
    """The agent sees the staged spans, in the slots, where it offers
    staging memory the client can map, and the bytes in frames otherwise;
    Stage is asked once at most. The bytes arrive either way."""
    agent, v = stage_agent(mode)
    for n, off in SIZES:
        data = os.urandom(n)
        v.write_region(5, off, data)
        assert agent.region[off:off + n] == data
        assert v.read_region(5, off + 1, n) == agent.region[off + 1:off + 1 + n]
    ops = [f.op for f in agent.sent]
    assert ops.count(fr.OP_STAGE) == (0 if mode == "no feature" else 1)
    one_sided = [f for f in agent.sent if f.op in (fr.OP_WRITE, fr.OP_READ)]
    want = [k for n, _ in SIZES for k in pieces(n, 64 * KIB)] * 2
    if mode != "staged":
        assert not any(f.flags for f in one_sided)
        assert sorted(len(f.payload) if f.op == fr.OP_WRITE else struct.unpack(">I", f.payload)[0]
                      for f in one_sided) == sorted(want)
        assert v._staging.stage is None
        return
    got = [struct.unpack(">II", f.payload) for f in one_sided if f.flags == fr.FLAG_MEMFD and len(f.payload) == 8]
    assert len(got) == len(one_sided)
    assert sorted(k for _, k in got) == sorted(want)
    assert all(at % (64 * KIB) == 0 for at, _ in got)


def test_abandoned_slot_waits_for_the_answer(stage_agent):
    """A Write whose caller gave up keeps its slot until the agent
    answered: the agent may still be reading it."""
    agent, v = stage_agent("staged")
    v.write_region(5, 0, b"first")
    st = v._staging.stage
    agent.hold.clear()
    with pytest.raises(rdmavisor.DeadlineExceeded):
        v.write_region(5, 0, b"held back", timeout=0.2)
    assert len(st.free) == _stage.SLOTS - 1
    agent.hold.set()
    v.write_region(5, 100, b"after")  # answered after the held one
    assert len(st.free) == _stage.SLOTS
    assert agent.region[:9] == b"held back" and agent.region[100:105] == b"after"


def test_session_end_unmaps(stage_agent):
    """The agent gone, the vconn fails and its staging memory is unmapped."""
    agent, v = stage_agent("staged")
    v.write_region(5, 0, b"staged")
    st = v._staging.stage
    agent.conn.shutdown(socket.SHUT_RDWR)
    with pytest.raises(rdmavisor.AgentGoneError):
        v.recv_message(timeout=10)
    assert st._mm is None
    with pytest.raises(rdmavisor.AgentGoneError):
        v.write_region(5, 0, b"after")
