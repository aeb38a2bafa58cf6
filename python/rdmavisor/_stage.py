"""Staging memory: where the agent offers it (fr.FEATURE_STAGE), a vconn's
one-sided operations on the peer's regions (write_region, read_region)
carry their bytes in memory this process shares with the agent, not in
frames (Go: pkg/vconn/stage.go; docs/protocol.md R3.30, R3.31).

A vconn asks for SIZE bytes (Stage) on its first such operation and maps
the memfd the OK passes, cut in SLOTS slots. Each piece of an operation,
of at most a slot, takes a free slot: a Write's bytes are copied into it
and the agent posts the RDMA WRITE from there; a Read's land in it and
are copied out after the OK. So up to SLOTS threads of a vconn copy and
wait at once, and a piece is one round trip of a 36-byte frame. Where the
agent offers no staging, refuses it or passes memory that cannot be
mapped, the operations stay in frames (_region)."""

import fcntl
import mmap
import os
import threading

from . import _frame as fr
from ._wait import NOT_READY
from .errors import ClosedError

SIZE = 256 << 10  # asked for once per vconn: 4 slots of a frame's 64 KiB
SLOTS = 4

_ASK = object()  # Staging._check: the calling thread asks the agent


def map_memfd(fd, size):
    """Maps size bytes of the memfd fd shared and writable, as the Go SDK
    does (shm.MapMemfd): a memfd that could shrink would make a copy into
    the mapping fault (SIGBUS), so it must be sealed against shrinking.
    OSError if it is not such a memfd."""
    st = os.fstat(fd)
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)  # OSError (EINVAL): not a memfd
    if not seals & fcntl.F_SEAL_SHRINK:
        raise OSError("staging memory: the memfd can shrink")
    if st.st_size < size:
        raise OSError(f"staging memory: memfd of {st.st_size} bytes, {size} needed")
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)


class Stage:
    """A vconn's mapped staging memory and its slots."""

    def __init__(self, mm, size):
        self.slot = size // SLOTS  # bytes per slot
        self.free = [i * self.slot for i in range(SLOTS)]  # offsets; guarded by the vconn's _cond
        # Held by a copy, and to unmap: a thread may copy while another
        # closes the vconn, and a closed mmap must not be touched.
        self._lock = threading.Lock()
        self._mm = mm  # None once unmapped
        self._err = None  # why it was unmapped

    def copy_in(self, at, view):
        with self._lock:
            if self._mm is None:
                raise self._err
            self._mm[at:at + len(view)] = view

    def copy_out(self, at, n):
        with self._lock:
            if self._mm is None:
                raise self._err
            return self._mm[at:at + n]

    def unmap(self, err):
        """Ends the mapping once no copy is inside it; later copies raise err."""
        with self._lock:
            if self._mm is not None:
                self._mm.close()
                self._mm, self._err = None, err

    def reset_after_fork(self):
        self._lock = threading.Lock()  # a parent's thread may have held it


class _Held:
    """A slot a piece holds: it is free again once the agent answered and
    the caller is done with it, whichever comes last. A caller that gave
    up waiting leaves it to the answer: until then the agent may still
    read or write it."""

    def __init__(self, staging, st, at):
        self._staging, self._st, self.at = staging, st, at
        self._lock = threading.Lock()
        self._left = 2

    def release(self, *_):
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._staging.put(self._st, self.at)


class Staging:
    """A vconn's staging memory, asked for once: the answer is taken
    whoever waits for it, so memory the agent made is never left unknown
    here (a second Stage would be refused). State guarded by the vconn's
    _cond."""

    def __init__(self, conn):
        self._c = conn
        self.asked = False
        self.answered = False
        self.stage = None  # a Stage once answered and mapped
        self.gone = None  # why it was unmapped: the vconn closed, its session ended

    def get(self, timeout, what):
        """The vconn's Stage, asked for on first use; None where the agent
        offers none, refused it or passed memory not mapped here."""
        c = self._c
        if self.answered:
            return self.stage
        if not c._s.features & fr.FEATURE_STAGE:
            return None
        while True:
            r = c._block(self._check, timeout, what)
            if r is not _ASK:
                return r
            self._ask(timeout, what)

    def _check(self):
        c = self._c
        if self.answered:
            return self.stage
        if c._closing:
            raise ClosedError("vconn closed")
        if c._err is not None:
            raise c._err
        if not self.asked:
            self.asked = True
            return _ASK
        return NOT_READY

    def _ask(self, timeout, what):
        """Sends Stage in a place of the vconn's window; its OK comes to
        _answered."""
        c = self._c
        try:
            c._block(c._token, timeout, what)
        except BaseException:
            with c._cond:
                self.asked = False  # not sent: the next waiter asks
                c._wake()
            raise
        try:
            c._request_op(fr.Frame(fr.OP_STAGE, arg2=SIZE), self._answered)
        except BaseException:
            self._answered(None, ClosedError("staging memory not asked for"))
            raise

    def _answered(self, f, err):
        """Stage's answer: on the reading thread, which has the OK's
        descriptor; or the vconn's close or the session's end."""
        fds = self._c._s.take_rights() if err is None else []
        st = None
        try:
            if err is None and len(fds) == 1 and SLOTS <= f.arg2 <= SIZE:
                st = Stage(map_memfd(fds[0], f.arg2), f.arg2)
        except (OSError, ValueError):
            st = None  # the operations stay in frames
        finally:
            for fd in fds:
                os.close(fd)
        c = self._c
        with c._cond:
            gone = self.gone
            if gone is None:
                self.stage = st
            self.answered = True
            c._wake()
        if gone is not None and st is not None:
            st.unmap(gone)

    def unmap(self, err):
        """At the vconn's close or the session's end."""
        with self._c._cond:
            if self.gone is None:
                self.gone = err
            st = self.stage
        if st is not None:
            st.unmap(err)

    def reset_after_fork(self):
        if self.stage is not None:
            self.stage.reset_after_fork()

    def put(self, st, at):
        c = self._c
        with c._cond:
            st.free.append(at)
            c._wake()

    def _take(self, st):
        c = self._c
        if c._closing:
            raise ClosedError("vconn closed")
        if c._err is not None:
            raise c._err
        return st.free.pop() if st.free else NOT_READY

    def _piece(self, st, op, region_id, offset, view, n, timeout, what):
        """One piece of at most a slot: view's bytes written at offset (op
        OP_WRITE), or n bytes read there (OP_READ, view None), returned."""
        c = self._c
        at = c._block(lambda: self._take(st), timeout, what)
        try:
            if view is not None:
                st.copy_in(at, view)
            c._block(c._token, timeout, what)
        except BaseException:
            self.put(st, at)
            raise
        held = _Held(self, st, at)
        f = fr.Frame(op, flags=fr.FLAG_MEMFD, arg=region_id, arg2=offset, payload=fr.encode_staged(at, n))
        try:
            call = c._request_op(f, held.release)
        except BaseException:
            self.put(st, at)  # not sent: no answer comes
            raise
        try:
            call._block(call.check, timeout, what)
            return None if view is not None else st.copy_out(at, n)
        finally:
            held.release()

    def write(self, region_id, offset, data, timeout, what):
        """write_region through staging memory; False where the vconn has
        none (the caller sends the bytes in frames)."""
        view = memoryview(data).cast("B")
        if not view:
            return False
        st = self.get(timeout, what)
        if st is None:
            return False
        for i in range(0, len(view), st.slot):
            p = view[i:i + st.slot]
            self._piece(st, fr.OP_WRITE, region_id, offset + i, p, len(p), timeout, what)
        return True

    def read(self, region_id, offset, n, timeout, what):
        """read_region's bytes through staging memory; None where the vconn
        has none. A read of one slot at most is one copy, out of the slot;
        a longer one is joined, a second."""
        if n <= 0:
            return None
        st = self.get(timeout, what)
        if st is None:
            return None
        parts = [self._piece(st, fr.OP_READ, region_id, offset + i, None, min(st.slot, n - i), timeout, what)
                 for i in range(0, n, st.slot)]
        return parts[0] if len(parts) == 1 else b"".join(parts)
