"""One connection to the node agent: a SOCK_SEQPACKET socket, a reader
thread that dispatches the agent's frames, and the requests awaiting
replies."""

import array
import os
import socket
import threading

from . import _frame as fr
from ._wait import NOT_READY, Waitable
from .errors import AgentGoneError, from_code


class Call(Waitable):
    """A request's reply, awaited."""

    def __init__(self):
        super().__init__()
        self.done = False
        self.frame = None
        self.err = None

    def complete(self, f, err):
        with self._cond:
            self.done, self.frame, self.err = True, f, err
            self._wake()

    def check(self):
        if not self.done:
            return NOT_READY
        if self.err is not None:
            raise self.err
        return self.frame


# The codes of the errors the agent sends right before it closes a session
# (a malformed frame, a version it does not speak, too many sessions): the
# end of the connection is reported with them when they answer a request
# nobody waits for. An Error with req 0 and handle 0 ends the session
# itself (docs/protocol.md §3, §8).
_HANGUP_CODES = (1, 2, 16)


def error_of(f):
    """The exception an Error frame carries; None for other frames."""
    if f.op != fr.OP_ERROR:
        return None
    return from_code(f.arg, f.payload.decode("utf-8", "replace"))


class Session:
    """A connection to the agent. Handlers of pushed frames (deliver, on
    vconns and listeners) and reply callbacks run on the reader thread and
    must not block."""

    def __init__(self, path, on_accept):
        self.path = path
        self._on_accept = on_accept
        self._wlock = threading.Lock()
        self._lock = threading.Lock()
        self._next_req = 0  # guarded by _lock
        self._pending = {}  # req -> callback(frame, err); guarded by _lock
        self.conns = {}  # handle -> VConn; guarded by _lock
        self.listeners = {}  # handle -> Listener; guarded by _lock
        self.err = None  # why the session broke; guarded by _lock
        self._hangup = None  # an Error the agent sent without a request to answer
        self.info = None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            sock.connect(path)
        except OSError as e:
            sock.close()
            if isinstance(e, PermissionError):
                why = (f"permission denied on {path}: a pod that does not run as root needs the RDMAService's "
                       "spec.socketGroup among its securityContext.supplementalGroups")
            elif isinstance(e, FileNotFoundError):
                why = (f"no agent socket at {path}: does the pod request an RDMAvisor vconn resource "
                       "(rdmavisor.io/vconn or a ResourceClaim)?")
            else:
                why = f"{path}: {e}"
            raise AgentGoneError(f"cannot connect to the agent: {why}") from e
        self._sock = sock
        self._reader = threading.Thread(target=self._read, name="rdmavisor-session", daemon=True)
        self._reader.start()

    def hello(self, timeout):
        call = Call()
        self.request(fr.Frame(fr.OP_HELLO, arg=fr.VERSION), call.complete)
        try:
            f = call._block(call.check, timeout, "hello")
            if f.arg != fr.VERSION:
                raise fr.FrameError(f"the agent answered with protocol version {f.arg}, this client speaks {fr.VERSION}")
            self.info = fr.decode_hello(f.payload)
        except fr.FrameError as e:
            err = AgentGoneError(f"hello: {e}")
            self.shutdown(err)
            raise err from None
        except BaseException as e:
            self.shutdown(AgentGoneError(f"hello: {e}"))
            raise
        return self.info

    def alive(self):
        return self.err is None

    def failure(self):
        with self._lock:
            return self.err or AgentGoneError("connection closed")

    def protocol_error(self, what):
        """Breaks the session for a reply the agent should not have sent
        (the Go SDK breaks it for a malformed frame); the error to raise."""
        self.shutdown(AgentGoneError(f"protocol error: {what}"))
        return self.failure()

    def text(self, b, what):
        """b, an address or name the agent sent, as text; bytes that are not
        UTF-8 are a protocol error (a message is decoded with
        errors="replace" instead: error_of)."""
        try:
            return bytes(b).decode("utf-8")
        except UnicodeDecodeError:
            raise self.protocol_error(f"{what}: not UTF-8: {bytes(b)!r}") from None

    def exact(self, rep, n, what):
        """The payload of a read's reply, which must carry the n bytes
        asked for (as libvconn checks): an empty one would have the caller
        ask again forever, a longer one give more than asked."""
        if len(rep.payload) != n:
            raise self.protocol_error(f"{what}: the agent returned {len(rep.payload)} bytes of {n}")
        return rep.payload

    def write(self, f):
        self.write_raw(fr.encode(f))

    def write_raw(self, b):
        try:
            with self._wlock:
                self._sock.send(b)
        except OSError as e:
            self.shutdown(AgentGoneError(f"write to the agent: {e}"))
            raise self.failure() from e

    def request(self, f, cb):
        """Sends a request; cb(frame, err) gets its reply (or the
        session's failure) on the reader thread. Returns its req."""
        with self._lock:
            if self.err is not None:
                raise self.err
            self._next_req = (self._next_req + 1) & 0xFFFFFFFF or 1
            req = self._next_req
            self._pending[req] = cb
        try:
            self.write(f._replace(req=req))
        except Exception:
            with self._lock:
                mine = self._pending.pop(req, None) is not None
            if mine:
                raise
            # The failure was delivered to cb already.
        return req

    def forget(self, req):
        """Drops a request whose caller stopped waiting (its reply, if it
        comes, is ignored)."""
        with self._lock:
            return self._pending.pop(req, None)

    def call(self, f, timeout, what):
        c = Call()
        req = self.request(f, c.complete)
        try:
            return c._block(c.check, timeout, what)
        except BaseException:
            self.forget(req)
            raise

    async def acall(self, f, timeout, what):
        c = Call()
        req = self.request(f, c.complete)
        try:
            return await c._await(c.check, timeout, what)
        except BaseException:
            self.forget(req)
            raise

    def _read(self):
        fdspace = socket.CMSG_SPACE(8 * array.array("i").itemsize)
        while True:
            try:
                data, anc, _, _ = self._sock.recvmsg(fr.MAX_FRAME + 1, fdspace)
            except OSError as e:
                self.shutdown(AgentGoneError(f"read from the agent: {e}"))
                return
            _close_fds(anc)  # descriptors come only with Shm, which this package does not ask for
            if not data:
                msg = "the agent closed the connection"
                if self._hangup is not None:
                    msg += f" after {self._hangup}"
                self.shutdown(AgentGoneError(msg))
                return
            try:
                f = fr.decode(data)
            except fr.FrameError as e:
                self.shutdown(AgentGoneError(f"protocol error: {e}"))
                return
            try:
                self._dispatch(f)
            except Exception as e:  # a bug here must not leave callers waiting forever
                self.shutdown(AgentGoneError(f"dispatching {f.op}: {e!r}"))
                return

    def _dispatch(self, f):
        if f.op == fr.OP_ERROR and f.req == 0 and f.handle == 0:
            # The agent's last frame: the session is over, whether or not
            # its close has come yet.
            self.shutdown(AgentGoneError(f"the agent ended the session: {error_of(f)}"))
            return
        if f.req != 0 and f.op in (fr.OP_OK, fr.OP_ERROR):
            with self._lock:
                cb = self._pending.pop(f.req, None)
            if cb is not None:
                cb(f, error_of(f))
            elif f.op == fr.OP_ERROR and f.arg in _HANGUP_CODES:
                self._hangup = error_of(f)
            return
        if f.op in (fr.OP_DATA, fr.OP_EOF, fr.OP_ERROR):
            with self._lock:
                c = self.conns.get(f.handle)
            if c is not None:
                c._deliver(f)
        elif f.op == fr.OP_ACCEPT:
            with self._lock:
                ln = self.listeners.get(f.handle)
            if ln is not None:
                self._on_accept(self, ln, f)

    def shutdown(self, err):
        """Breaks the session with err: every waiter and vconn fails."""
        with self._lock:
            if self.err is not None:
                return
            self.err = err
            pending, conns, lns = self._pending, self.conns, self.listeners
            self._pending, self.conns, self.listeners = {}, {}, {}
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join(5)
        self._sock.close()
        for cb in pending.values():
            cb(None, err)
        for c in conns.values():
            c._fail(err)
        for ln in lns.values():
            ln._fail(err)

    def after_fork_in_child(self):
        """In a forked child: the socket and the reader belong to the
        parent. Everything of this session fails in the child, without
        the locks the parent's threads may have held, and the parent's
        socket stays open in the parent."""
        err = AgentGoneError("the connection to the agent stayed with the parent process across fork(); "
                             "the child's vconns are its own: dial or listen again in the child")
        self._lock = threading.Lock()
        self._wlock = threading.Lock()
        self.err = err
        conns, lns = list(self.conns.values()), list(self.listeners.values())
        self._pending, self.conns, self.listeners = {}, {}, {}
        try:
            self._sock.close()  # the child's descriptor only
        except OSError:
            pass
        for x in conns + lns:
            x._reset_after_fork()
            x._fail(err)


def _close_fds(anc):
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
            for fd in fds:
                os.close(fd)
