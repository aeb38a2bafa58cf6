"""Client, VConn, Listener and Region: the package's API over a Session."""

import ipaddress
import os
import socket
import threading
import weakref
from typing import NamedTuple, Optional

from . import _frame as fr
from ._session import Session
from ._wait import NOT_READY, Waitable
from .errors import (AgentGoneError, BadRequestError, ClosedError, NoHandleError, NotStreamError,
                     TooLargeError, UnknownHostError, VConnError)

ENV_SOCKET = "RDMAVISOR_SOCKET"

# How many messages of one vconn the agent may push ahead of the
# application's reads (the Go SDK's recvWindow).
RECV_WINDOW = 32

# How long close waits for the agent (it drains what was sent first).
CLOSE_TIMEOUT = 5.0

ACCESS_READ = 1
ACCESS_WRITE = 2


class Message(NamedTuple):
    """One received message; imm is None when it carries no immediate."""

    data: bytes
    imm: Optional[int] = None


def split_addr(addr):
    """Parses "host:port" (port 1..65535; IPv6 hosts in brackets) as the
    agent does; the host may be empty."""
    host, sep, port = addr.rpartition(":")
    if not sep:
        raise BadRequestError(f"address {addr!r}: want host:port")
    if host.startswith("["):
        if not host.endswith("]"):
            raise BadRequestError(f"address {addr!r}: want host:port")
        host = host[1:-1]
    elif ":" in host:
        raise BadRequestError(f"address {addr!r}: too many colons (an IPv6 host goes in brackets)")
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise BadRequestError(f"address {addr!r}: port {port!r}: want 1..65535")
    return host, int(port)


def join_addr(host, port):
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_clients = weakref.WeakSet()


def _after_fork_in_child():
    for c in list(_clients):
        c._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class Client:
    """An application's connection to its node agent, through the
    allocation's socket ($RDMAVISOR_SOCKET by default). If the connection
    breaks (the agent restarted, a malformed frame, a fork), its vconns
    fail with AgentGoneError and the next dial or listen connects again.
    """

    def __init__(self, socket_path=None, *, timeout=10.0):
        if socket_path is None:
            socket_path = os.environ.get(ENV_SOCKET, "")
            if not socket_path:
                raise AgentGoneError(f"{ENV_SOCKET} is not set: is the pod allocated an RDMAvisor vconn resource?")
        self.socket_path = os.fspath(socket_path)
        self.timeout = timeout  # of connecting, dialling, listening and region operations
        self._lock = threading.Lock()
        self._s = None  # guarded by _lock
        self._closed = False
        _clients.add(self)
        self._session()

    def _after_fork_in_child(self):
        self._lock = threading.Lock()
        s, self._s = self._s, None
        if s is not None:
            s.after_fork_in_child()

    def _session(self):
        with self._lock:
            if self._closed:
                raise ClosedError("client closed")
            if self._s is not None and self._s.alive():
                return self._s
            s = Session(self.socket_path, _accepted)
            s.hello(self.timeout)
            self._s = s
            return s

    def _info(self):
        return self._session().info

    @property
    def quota(self):
        """The number of vconns the agent lets this allocation hold open."""
        return self._info().quota

    @property
    def node(self):
        """The agent's node name."""
        return self._info().node

    @property
    def send_window(self):
        """Operations of one vconn that may be unanswered by the agent."""
        return self._info().send_window

    @property
    def max_message(self):
        """The largest message of any vconn (each has its own: VConn.max_message)."""
        return self._info().max_message

    def dial(self, addr, *, timeout=None):
        """Connects a vconn to the listener at "host:port": a pod's IP, a
        node's name or IP (its host services), or a name the agent does not
        know, which is resolved (DNS) and dialled IP by IP."""
        timeout = self.timeout if timeout is None else timeout
        host, port = _dial_addr(addr)
        try:
            return self._dial(addr, timeout)
        except UnknownHostError as e:
            ips = _resolve(host, e)
        errs = []
        for ip in ips:
            try:
                return self._dial(join_addr(ip, port), timeout)
            except VConnError as err:
                errs.append(err)
        raise type(errs[-1])(f"dial {addr} ({len(ips)} IPs): " + "; ".join(str(x) for x in errs))

    async def adial(self, addr, *, timeout=None):
        """dial, for asyncio."""
        timeout = self.timeout if timeout is None else timeout
        host, port = _dial_addr(addr)
        try:
            return await self._adial(addr, timeout)
        except UnknownHostError as e:
            ips = _resolve(host, e)
        errs = []
        for ip in ips:
            try:
                return await self._adial(join_addr(ip, port), timeout)
            except VConnError as err:
                errs.append(err)
        raise type(errs[-1])(f"dial {addr} ({len(ips)} IPs): " + "; ".join(str(x) for x in errs))

    def _dial(self, addr, timeout):
        s = self._session()
        d = _Dial(s, addr)
        _call_then(s, fr.Frame(fr.OP_DIAL, payload=addr.encode()), timeout, f"dial {addr}", d)
        return d.started()

    async def _adial(self, addr, timeout):
        s = self._session()
        d = _Dial(s, addr)
        await _acall_then(s, fr.Frame(fr.OP_DIAL, payload=addr.encode()), timeout, f"dial {addr}", d)
        return d.started()

    def listen(self, addr, *, timeout=None):
        """Listens at addr: ":port" (or a port number) of the allocation's
        own port space: its pod's, or its node's host services'."""
        s, host, port, f = self._listen_frame(addr)
        rep = s.call(f, self.timeout if timeout is None else timeout, f"listen {addr}")
        return self._listener(s, host, port, rep, addr)

    async def alisten(self, addr, *, timeout=None):
        """listen, for asyncio."""
        s, host, port, f = self._listen_frame(addr)
        rep = await s.acall(f, self.timeout if timeout is None else timeout, f"listen {addr}")
        return self._listener(s, host, port, rep, addr)

    def _listen_frame(self, addr):
        if isinstance(addr, int):
            addr = f":{addr}"
        host, port = split_addr(addr)
        return self._session(), host, port, fr.Frame(fr.OP_LISTEN, arg=port)

    def _listener(self, s, host, port, rep, addr):
        bound = s.text(rep.payload, f"listen {addr}: the address bound") or join_addr(s.info.node, port)
        ln = Listener(s, rep.handle, bound)
        with s._lock:
            if s.err is not None:
                raise s.err
            s.listeners[ln.handle] = ln
        if host:
            try:
                unspecified = ipaddress.ip_address(host).is_unspecified
            except ValueError:
                unspecified = False
            if not unspecified and split_addr(bound)[0] != host:
                ln.close()
                raise BadRequestError(f"listen {addr}: this allocation listens at {bound}, not at {host}")
        return ln

    def close(self):
        """Closes the connection to the agent, and with it every vconn and
        listener of this client."""
        with self._lock:
            self._closed = True
            s, self._s = self._s, None
        if s is not None:
            s.shutdown(ClosedError("client closed"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send_raw(self, data, *, timeout=None):
        """Sends data as one datagram, as is, and waits for the agent's
        answer: for tests of the agent's handling of malformed frames. A
        request id is patched in at bytes 4..7 when there is room. The
        session breaks (the agent hangs up on a malformed frame); the next
        dial or listen connects again."""
        s = self._session()
        data = bytearray(data)
        from ._session import Call

        c = Call(s)
        with s._lock:
            s._next_req = (s._next_req + 1) & 0xFFFFFFFF or 1
            req = s._next_req
            s._pending[req] = c.complete
        if len(data) >= 8:
            data[4:8] = req.to_bytes(4, "big")
        # Else there is no room for a req: the agent answers with req 0,
        # then hangs up, which completes the call with the reason.
        s.write_raw(bytes(data))
        return c._block(c.check, self.timeout if timeout is None else timeout, "raw frame")


def _dial_addr(addr):
    host, port = split_addr(addr)
    if not host:
        raise BadRequestError(f"dial {addr!r}: no host")
    return host, port


def _resolve(host, err):
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError as e:
        raise UnknownHostError(f"{host}: no node of that name, and resolving it: {e}") from err
    ips = list(dict.fromkeys(i[4][0] for i in infos))
    if not ips:
        raise UnknownHostError(f"{host} resolves to no IP") from err
    return ips


class _Dial:
    """A dial's vconn: registered on the reader thread when the reply
    comes, before any push for its handle; closed, not leaked against the
    quota, if the caller stopped waiting."""

    def __init__(self, s, addr):
        self.s, self.addr = s, addr
        self.lock = threading.Lock()
        self.conn = None
        self.abandoned = False

    def registered(self, f, err):
        if err is not None:
            return
        c = _new_conn(self.s, f.handle, f.arg2, self.s.info.node, self.addr)
        with self.lock:
            if not self.abandoned:
                self.conn = c
                return
        if c is not None:
            c._close_async()

    def abandon(self):
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


def _call_then(s, f, timeout, what, d):
    from ._session import Call

    c = Call(s)

    def cb(rep, err):
        d.registered(rep, err)
        c.complete(rep, err)

    s.request(f, cb)
    try:
        c._block(c.check, timeout, what)
    except BaseException:
        d.abandon()
        raise


async def _acall_then(s, f, timeout, what, d):
    from ._session import Call

    c = Call(s)

    def cb(rep, err):
        d.registered(rep, err)
        c.complete(rep, err)

    s.request(f, cb)
    try:
        await c._await(c.check, timeout, what)
    except BaseException:
        d.abandon()
        raise


def _close_handle_async(s, h):
    try:
        s.request(fr.Frame(fr.OP_CLOSE, handle=h), lambda rep, err: None)
    except VConnError:
        pass


def _new_conn(s, handle, arg2, local, remote):
    transport, maxmsg = fr.vconn_info(arg2)
    c = VConn(s, handle, transport, maxmsg or s.info.max_message, local, remote)
    with s._lock:
        if s.err is not None:
            return None
        s.conns[handle] = c
    return c


def _accepted(s, ln, f):
    """An Accept push, on the reader thread."""
    c = _new_conn(s, f.arg, f.arg2, ln.address, f.payload.decode("utf-8", "replace"))
    if c is None:
        return
    try:
        c._grant(RECV_WINDOW)
    except VConnError:
        return
    ln._push(c)


class VConn(Waitable):
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
        super().__init__()
        self._s = self._leads = s
        self.handle = handle
        self.transport = transport  # "rc", "uc", "ud", "auto", or "" when the agent did not say
        self.max_message = max_message
        self.local_address = local
        self.remote_address = remote
        self._timeout = None
        # Guarded by _cond:
        self._q = []  # received, unread Messages
        self._eof = False
        self._err = None  # the vconn failed
        self._send_err = None  # an asynchronous send failed
        self._consumed = 0  # read since the last grant
        self._outstanding = 0  # operations the agent has not answered
        self._closing = False
        self._calls = set()  # operations (_OpCall) awaiting the agent's reply
        self._cur = memoryview(b"")  # the rest of the message a stream recv is in
        self._rlock = threading.Lock()  # serialises stream reads

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
                from ._session import error_of

                self._err = error_of(f)
            self._wake()

    def _fail(self, err):
        with self._cond:
            if self._err is None:
                self._err = err
            self._wake()

    def _grant(self, n):
        self._s.write(fr.Frame(fr.OP_GRANT, handle=self.handle, arg=n))

    # Timeouts.

    def settimeout(self, timeout):
        """None: block; 0: non-blocking; else seconds each call may wait."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout {timeout}: want None or at least 0")
        self._timeout = timeout

    def gettimeout(self):
        return self._timeout

    def setblocking(self, flag):
        self._timeout = None if flag else 0.0

    def _t(self, timeout):
        return self._timeout if timeout is None else timeout

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
        c = _OpCall(self)
        try:
            self._s.request(f._replace(handle=self.handle), c.complete)
        except BaseException:
            self._release()
            raise
        return c._block(c.check, timeout, what)

    async def aop(self, f, timeout=None, what="op"):
        timeout = self._t(timeout)
        await self._await(self._token, timeout, what)
        c = _OpCall(self)
        try:
            self._s.request(f._replace(handle=self.handle), c.complete)
        except BaseException:
            self._release()
            raise
        return await c._await(c.check, timeout, what)

    def export(self, size, access=ACCESS_READ | ACCESS_WRITE, *, timeout=None):
        """Registers size bytes in the agent and exports them to the peer
        vconn, which may read or write them as access allows."""
        rep = self.op(fr.Frame(fr.OP_EXPORT, arg=access, arg2=size), timeout, "export")
        return Region(self, rep.arg, size)

    def write_region(self, region_id, offset, data, *, timeout=None):
        """RDMA WRITE of data into the peer's region at offset; returns once placed."""
        view = memoryview(data).cast("B")
        for i in range(0, len(view), fr.MAX_PAYLOAD):
            self.op(fr.Frame(fr.OP_WRITE, arg=region_id, arg2=offset + i, payload=bytes(view[i:i + fr.MAX_PAYLOAD])),
                    timeout, f"write region {region_id}")

    def read_region(self, region_id, offset, n, *, timeout=None):
        """RDMA READ of n bytes of the peer's region at offset."""
        out = bytearray()
        while len(out) < n:
            k = min(n - len(out), fr.MAX_PAYLOAD)
            rep = self.op(fr.Frame(fr.OP_READ, arg=region_id, arg2=offset + len(out), payload=fr.encode_length(k)),
                          timeout, f"read region {region_id}")
            out += self._s.exact(rep, k, f"read region {region_id}")
        return bytes(out)

    # Closing.

    def _drained(self):
        return True if self._outstanding == 0 or self._err is not None else NOT_READY

    def close(self):
        """Closes the vconn after what was sent is handed over (the peer
        reads the end of the stream after the last message); frees its
        slot of the quota."""
        with self._cond:
            if self._closing:
                return
        try:
            self._block(self._drained, CLOSE_TIMEOUT, "close")
        except VConnError:
            pass
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._wake()
        try:
            self._s.call(fr.Frame(fr.OP_CLOSE, handle=self.handle), CLOSE_TIMEOUT, "close")
        except (AgentGoneError, NoHandleError):
            pass
        finally:
            self._closed()

    async def aclose(self):
        with self._cond:
            if self._closing:
                return
        try:
            await self._await(self._drained, CLOSE_TIMEOUT, "close")
        except VConnError:
            pass
        with self._cond:
            if self._closing:
                return
            self._closing = True
            self._wake()
        try:
            await self._s.acall(fr.Frame(fr.OP_CLOSE, handle=self.handle), CLOSE_TIMEOUT, "close")
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
            with c._cond:
                c.done, c.err = True, ClosedError("the vconn was closed before the agent ran the operation")
                c._wake()

    def _close_async(self):
        with self._cond:
            self._closing = True
            self._wake()
        with self._s._lock:
            self._s.conns.pop(self.handle, None)
        _close_handle_async(self._s, self.handle)

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


class _OpCall(Waitable):
    """The reply of an operation; it gives its window slot back when the
    reply comes, even if the caller stopped waiting."""

    def __init__(self, conn):
        super().__init__()
        self._conn = conn
        self._leads = conn._s
        self.done, self.frame, self.err = False, None, None
        with conn._cond:
            conn._calls.add(self)

    def complete(self, f, err):
        c = self._conn
        with c._cond:
            if self not in c._calls:
                return  # abandoned at close
            c._calls.discard(self)
        c._release()
        with self._cond:
            self.done, self.frame, self.err = True, f, err
            self._wake()

    def check(self):
        if not self.done:
            return NOT_READY
        if self.err is not None:
            raise self.err
        return self.frame


class Region:
    """Memory this side exported to the peer vconn. It lives in the agent's
    registered memory; read and write copy over the socket."""

    def __init__(self, conn, region_id, size):
        self._c = conn
        self.id = region_id  # names the region to the peer
        self.size = size

    def __repr__(self):
        return f"<Region {self.id} of {self.size} bytes>"

    def read(self, offset, n, *, timeout=None):
        out = bytearray()
        while len(out) < n:
            k = min(n - len(out), fr.MAX_PAYLOAD)
            rep = self._c.op(fr.Frame(fr.OP_LOCAL_READ, arg=self.id, arg2=offset + len(out), payload=fr.encode_length(k)),
                             timeout, f"region {self.id}")
            out += self._c._s.exact(rep, k, f"region {self.id}")
        return bytes(out)

    def write(self, offset, data, *, timeout=None):
        view = memoryview(data).cast("B")
        for i in range(0, len(view), fr.MAX_PAYLOAD):
            self._c.op(fr.Frame(fr.OP_LOCAL_WRITE, arg=self.id, arg2=offset + i, payload=bytes(view[i:i + fr.MAX_PAYLOAD])),
                       timeout, f"region {self.id}")

    def close(self, *, timeout=None):
        """Withdraws the export (its memory is freed once the peer confirmed)."""
        self._c.op(fr.Frame(fr.OP_UNEXPORT, arg=self.id), timeout, f"unexport region {self.id}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Listener(Waitable):
    """Accepts vconns dialled to its port."""

    def __init__(self, s, handle, address):
        super().__init__()
        self._s = self._leads = s
        self.handle = handle
        self.address = address  # "podIP:port", or "node:port" for host services
        self._timeout = None
        self._q = []  # guarded by _cond
        self._err = None
        self._closed = False

    def __repr__(self):
        return f"<Listener {self.address}>"

    def settimeout(self, timeout):
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout {timeout}: want None or at least 0")
        self._timeout = timeout

    def gettimeout(self):
        return self._timeout

    def _push(self, c):
        with self._cond:
            if not self._closed:
                self._q.append(c)
                self._wake()
                return
        c._close_async()

    def _fail(self, err):
        with self._cond:
            if self._err is None:
                self._err = err
            self._wake()

    def _readable(self):
        return bool(self._q) or self._err is not None or self._closed

    def _next(self):
        if self._closed:
            raise ClosedError(f"accept on the closed listener {self.address}")
        if self._q:
            return self._q.pop(0)
        if self._err is not None:
            raise self._err
        return NOT_READY

    def accept(self, *, timeout=None):
        """The next vconn dialled to this listener."""
        return self._block(self._next, self._timeout if timeout is None else timeout, "accept")

    async def aaccept(self, *, timeout=None):
        return await self._await(self._next, self._timeout if timeout is None else timeout, "accept")

    def close(self):
        """Stops listening; vconns accepted but not taken are closed."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            q, self._q = self._q, []
            self._wake()
            self._close_poll()
        for c in q:
            c._close_async()
        try:
            self._s.call(fr.Frame(fr.OP_CLOSE, handle=self.handle), CLOSE_TIMEOUT, "close listener")
        except (AgentGoneError, NoHandleError):
            pass
        finally:
            with self._s._lock:
                self._s.listeners.pop(self.handle, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
