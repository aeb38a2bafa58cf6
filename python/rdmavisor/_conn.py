"""Vconns: a session's connected vconn, dialled (Dial) or accepted (an
Accept push), its stream and messages, its window of operations and
their replies, its close (Go: pkg/vconn/conn.go, recv.go)."""

import contextlib
import threading
from typing import NamedTuple, Optional

from . import _frame as fr
from ._region import ACCESS_READ, ACCESS_WRITE, Region, read_chunks, write_chunks
from ._session import Call, Handle, error_of
from ._stage import Staging
from ._wait import NOT_READY
from .errors import AgentGoneError, ClosedError, NoHandleError, NotStreamError, TooLargeError, VConnError

# How many messages of one vconn the agent may push ahead of the
# application's reads (the Go SDK's recvWindow).
RECV_WINDOW = 32

# How long close waits for the agent (it drains what was sent first).
CLOSE_TIMEOUT = 5.0


class Message(NamedTuple):
    """One received message; imm is None when it carries no immediate."""

    data: bytes
    imm: Optional[int] = None


def close_handle_async(s, h):
    """Closes handle h of session s without waiting for the agent."""
    try:
        s.request(fr.Frame(fr.OP_CLOSE, handle=h), lambda rep, err: None)
    except VConnError:
        pass


def new_conn(s, handle, arg2, local, remote):
    """A vconn of session s for a dial's reply or an Accept push (arg2:
    its VConnInfo), registered for the frames pushed to its handle; None
    once the session broke."""
    transport, maxmsg = fr.vconn_info(arg2)
    c = VConn(s, handle, transport, maxmsg or s.info.max_message, local, remote)
    with s._lock:
        if s.err is not None:
            return None
        s.conns[handle] = c
    return c


def accepted(s, ln, f):
    """An Accept push, on the reader thread."""
    c = new_conn(s, f.arg, f.arg2, ln.address, f.payload.decode("utf-8", "replace"))
    if c is None:
        return
    try:
        c._grant(RECV_WINDOW)
    except VConnError:
        return
    ln._push(c)


class Dial(Call):
    """A dial's reply, and its vconn: registered on the reader thread when
    the reply comes, before any push for its handle; closed, not leaked
    against the quota, if the caller stopped waiting."""

    def __init__(self, s, addr):
        super().__init__(s)
        self.s, self.addr = s, addr
        self.lock = threading.Lock()
        self.conn = None
        self.abandoned = False

    def complete(self, f, err):
        self.registered(f, err)
        self.settle(f, err)

    def registered(self, f, err):
        if err is not None:
            return
        c = new_conn(self.s, f.handle, f.arg2, self.s.info.node, self.addr)
        with self.lock:
            if not self.abandoned:
                self.conn = c
                return
        if c is not None:
            c._close_async()

    def abandon(self, s, req):
        """The caller stopped waiting: the reply still comes to complete,
        whose vconn is closed."""
        with self.lock:
            self.abandoned = True
            c, self.conn = self.conn, None
        if c is not None:
            c._close_async()

    def started(self):
        if self.conn is None:
            raise self.s.failure()
        self.conn._grant(RECV_WINDOW)
        return self.conn


class VConn(Handle):
    """A vconn, used like a connected socket: send/sendall/recv/recv_into
    are a byte stream over its messages; send_message/recv_message keep
    message boundaries and carry an optional 32-bit immediate; export and
    read_region/write_region are one-sided access to memory.

    Blocking by default; settimeout(seconds) bounds each call
    (DeadlineExceeded, a TimeoutError), settimeout(0) makes calls that would
    wait raise BlockingIOError. Methods named a* are the same for asyncio.
    Safe for use from several threads.
    """

    def __init__(self, s, handle, transport, max_message, local, remote):
        super().__init__(s, handle)
        self.transport = transport  # "rc", "uc", "ud", "auto", or "" when the agent did not say
        self.max_message = max_message
        self.local_address = local
        self.remote_address = remote
        # Guarded by _cond (and _err, Handle's: the vconn failed):
        self._q = []  # received, unread Messages
        self._eof = False
        self._send_err = None  # an asynchronous send failed
        self._consumed = 0  # read since the last grant
        self._outstanding = 0  # operations the agent has not answered
        self._closing = False
        self._calls = set()  # operations (_OpCall) awaiting the agent's reply
        self._cur = memoryview(b"")  # the rest of the message a stream recv is in
        self._rlock = threading.Lock()  # serialises stream reads
        self._staging = Staging(self)  # memory for the bytes of write_region and read_region

    def __repr__(self):
        return f"<VConn {self.local_address} -> {self.remote_address} {self.transport or 'rc'}>"

    def _readable(self):
        return bool(self._q) or self._eof or self._err is not None or self._closing or bool(self._cur)

    # State changes from the reader thread.

    def _deliver(self, f):
        with self._cond:
            if f.op == fr.OP_DATA:
                self._q.append(Message(f.payload, f.arg if f.flags & fr.FLAG_IMM else None))
            elif f.op == fr.OP_EOF:
                self._eof = True
            elif self._err is None:
                self._err = error_of(f)
            self._wake()

    def _fail(self, err):
        super()._fail(err)
        self._staging.unmap(err)  # the session ended: the agent no longer reaches it

    def _reset_after_fork(self):
        super()._reset_after_fork()
        self._staging.reset_after_fork()

    def _grant(self, n):
        self._s.write(fr.Frame(fr.OP_GRANT, handle=self.handle, arg=n))

    # Timeouts (settimeout, gettimeout: Handle's).

    def setblocking(self, flag):
        self._timeout = None if flag else 0.0

    # Receiving.

    def _next(self):
        """The check of a receive: (Message or None at EOF, grant)."""
        if self._closing:
            raise ClosedError("recv on a closed vconn")
        if self._q:
            m = self._q.pop(0)
            self._consumed += 1
            grant = 0
            if self._consumed >= RECV_WINDOW // 2:
                grant, self._consumed = self._consumed, 0
            return m, grant
        if self._eof:
            return None, 0
        if self._err is not None:
            raise self._err
        return NOT_READY

    def _took(self, r):
        m, grant = r
        if grant:
            try:
                self._grant(grant)
            except VConnError:
                pass  # the vconn fails; the next call says so
        return m

    def recv_message(self, *, timeout=None):
        """The next message whole, or None once the peer closed."""
        return self._took(self._block(self._next, self._t(timeout), "recv"))

    async def arecv_message(self, *, timeout=None):
        return self._took(await self._await(self._next, self._t(timeout), "recv"))

    def _stream(self):
        if not fr.reliable(self.transport):
            raise NotStreamError(f"the vconn's transport, {self.transport}, can lose messages: a byte stream "
                                 "(send, recv) needs rc or auto; use send_message and recv_message")

    def recv(self, bufsize, *, timeout=None):
        """Up to bufsize bytes of the stream; b"" once the peer closed."""
        self._stream()
        with self._rlock:
            while not self._cur:
                if bufsize == 0:
                    return b""
                m = self.recv_message(timeout=timeout)
                if m is None:
                    return b""
                self._cur = memoryview(m.data)
            out, self._cur = bytes(self._cur[:bufsize]), self._cur[bufsize:]
        with self._cond:
            self._sync_poll()
        return out

    async def arecv(self, bufsize, *, timeout=None):
        self._stream()
        while not self._cur:
            if bufsize == 0:
                return b""
            m = await self.arecv_message(timeout=timeout)
            if m is None:
                return b""
            # Another coroutine's recv may have filled _cur while this one
            # waited: the stream goes on after what it left.
            self._cur = memoryview(bytes(self._cur) + m.data) if self._cur else memoryview(m.data)
        out, self._cur = bytes(self._cur[:bufsize]), self._cur[bufsize:]
        with self._cond:
            self._sync_poll()
        return out

    def recv_into(self, buffer, nbytes=0, *, timeout=None):
        view = memoryview(buffer).cast("B")
        n = nbytes or len(view)
        b = self.recv(n, timeout=timeout)
        view[: len(b)] = b
        return len(b)

    def recv_exactly(self, n, *, timeout=None):
        """n bytes of the stream; EOFError if it ends first."""
        parts, got = [], 0
        while got < n:
            b = self.recv(n - got, timeout=timeout)
            if not b:
                raise EOFError(f"vconn: stream ended after {got} of {n} bytes")
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    # Sending.

    def _token(self):
        """The check of taking one of the window's operation slots."""
        if self._closing:
            raise ClosedError("vconn closed")
        if self._err is not None:
            raise self._err
        if self._outstanding < max(1, self._s.info.send_window):
            self._outstanding += 1
            return True
        return NOT_READY

    def _release(self, err=None):
        with self._cond:
            self._outstanding -= 1
            if err is not None and self._send_err is None:
                self._send_err = err
            self._wake()

    def _send_check(self, data):
        if len(data) > self.max_message:
            raise TooLargeError(f"message of {len(data)} bytes, at most {self.max_message} on this "
                                f"{self.transport or 'rc'} vconn")
        with self._cond:
            if self._closing:
                raise ClosedError("send on a closed vconn")
            err = self._send_err or self._err
        if err is not None:
            raise err

    def _post(self, data, imm):
        f = fr.Frame(fr.OP_SEND, handle=self.handle, payload=bytes(data))
        if imm is not None:
            if not 0 <= imm <= 0xFFFFFFFF:
                raise ValueError(f"immediate {imm}: want a u32")
            f = f._replace(flags=fr.FLAG_IMM, arg=imm)
        try:
            self._s.request(f, lambda rep, err: self._release(err))
        except BaseException:
            self._release()
            raise

    def send_message(self, data, imm=None, *, timeout=None):
        """Sends data as one message (at most max_message bytes) with an
        optional immediate. It returns once the agent has the message; a
        failure it reports afterwards is raised by a later call."""
        self._send_check(data)
        self._block(self._token, self._t(timeout), "send")
        self._post(data, imm)

    async def asend_message(self, data, imm=None, *, timeout=None):
        self._send_check(data)
        await self._await(self._token, self._t(timeout), "send")
        self._post(data, imm)

    def sendall(self, data, *, timeout=None):
        """Writes data to the stream, in messages of at most max_message."""
        self._stream()
        view = memoryview(data).cast("B")
        if not view:
            self.send_message(b"", timeout=timeout)
        for i in range(0, len(view), self.max_message):
            self.send_message(view[i:i + self.max_message], timeout=timeout)

    def send(self, data, *, timeout=None):
        """sendall, returning the length sent (all of it)."""
        self.sendall(data, timeout=timeout)
        return len(data)

    async def asendall(self, data, *, timeout=None):
        self._stream()
        view = memoryview(data).cast("B")
        if not view:
            await self.asend_message(b"", timeout=timeout)
        for i in range(0, len(view), self.max_message):
            await self.asend_message(view[i:i + self.max_message], timeout=timeout)

    # Operations answered in order (regions).

    def op(self, f, timeout=None, what="op"):
        timeout = self._t(timeout)
        self._block(self._token, timeout, what)
        c = self._request_op(f)
        return c._block(c.check, timeout, what)

    async def aop(self, f, timeout=None, what="op"):
        timeout = self._t(timeout)
        await self._await(self._token, timeout, what)
        c = self._request_op(f)
        return await c._await(c.check, timeout, what)

    def _request_op(self, f, done=None):
        """Sends the operation f in the window slot taken: its _OpCall,
        which gives the slot back when the reply comes (and then calls
        done(frame, err), if given)."""
        c = _OpCall(self, done)
        try:
            self._s.request(f._replace(handle=self.handle), c.complete)
        except BaseException:
            self._release()
            raise
        return c

    def export(self, size, access=ACCESS_READ | ACCESS_WRITE, *, timeout=None):
        """Registers size bytes in the agent and exports them to the peer
        vconn, which may read or write them as access allows."""
        rep = self.op(fr.Frame(fr.OP_EXPORT, arg=access, arg2=size), timeout, "export")
        return Region(self, rep.arg, size)

    def write_region(self, region_id, offset, data, *, timeout=None):
        """RDMA WRITE of data into the peer's region at offset; returns once placed."""
        what = f"write region {region_id}"
        if not self._staging.write(region_id, offset, data, self._t(timeout), what):
            write_chunks(self, fr.OP_WRITE, region_id, offset, data, timeout, what)

    def read_region(self, region_id, offset, n, *, timeout=None):
        """RDMA READ of n bytes of the peer's region at offset."""
        what = f"read region {region_id}"
        b = self._staging.read(region_id, offset, n, self._t(timeout), what)
        return b if b is not None else read_chunks(self, fr.OP_READ, region_id, offset, n, timeout, what)

    # Closing.

    def _drained(self):
        return True if self._outstanding == 0 or self._err is not None else NOT_READY

    def close(self):
        """Closes the vconn after what was sent is handed over (the peer
        reads the end of the stream after the last message); frees its
        slot of the quota."""
        if self._is_closing():
            return
        with contextlib.suppress(VConnError):
            self._block(self._drained, CLOSE_TIMEOUT, "close")
        if self._close_begins():
            with self._closing_call():
                self._s.call(fr.Frame(fr.OP_CLOSE, handle=self.handle), CLOSE_TIMEOUT, "close")

    async def aclose(self):
        if self._is_closing():
            return
        with contextlib.suppress(VConnError):
            await self._await(self._drained, CLOSE_TIMEOUT, "close")
        if self._close_begins():
            with self._closing_call():
                await self._s.acall(fr.Frame(fr.OP_CLOSE, handle=self.handle), CLOSE_TIMEOUT, "close")

    def _is_closing(self):
        with self._cond:
            return self._closing

    def _close_begins(self):
        """Whether this close goes on once what was sent is drained (or
        the drain gave up): the first to get here marks the vconn closing."""
        with self._cond:
            if self._closing:
                return False
            self._closing = True
            self._wake()
            return True

    @contextlib.contextmanager
    def _closing_call(self):
        """Around the Close request: the agent gone, or the handle gone
        already, is the vconn closed all the same."""
        try:
            yield
        except (AgentGoneError, NoHandleError):
            pass
        finally:
            self._closed()

    def _closed(self):
        """After Close: the agent drops the operations it still had queued
        without answering them; their callers learn it here."""
        with self._s._lock:
            self._s.conns.pop(self.handle, None)
        with self._cond:
            calls, self._calls = self._calls, set()
            self._close_poll()
        for c in calls:
            c.settle(None, ClosedError("the vconn was closed before the agent ran the operation"))
        self._staging.unmap(ClosedError("vconn closed"))

    def _close_async(self):
        with self._cond:
            self._closing = True
            self._wake()
        with self._s._lock:
            self._s.conns.pop(self.handle, None)
        self._staging.unmap(ClosedError("vconn closed"))
        close_handle_async(self._s, self.handle)

    @property
    def error(self):
        """Why the vconn failed, or None."""
        with self._cond:
            return self._err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        await self.aclose()


class _OpCall(Call):
    """The reply of an operation; it gives its window slot back when the
    reply comes, even if the caller stopped waiting."""

    def __init__(self, conn, done=None):
        super().__init__(conn._s)
        self._conn = conn
        self._done = done
        with conn._cond:
            conn._calls.add(self)

    def settle(self, f, err):
        super().settle(f, err)
        if self._done is not None:
            self._done(f, err)  # once: complete and VConn._closed settle a call once

    def complete(self, f, err):
        c = self._conn
        with c._cond:
            if self not in c._calls:
                return  # abandoned at close: VConn._closed settled it
            c._calls.discard(self)
        c._release()
        self.settle(f, err)
