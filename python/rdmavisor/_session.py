"""One connection to the node agent: a SOCK_SEQPACKET socket, who reads
and dispatches the agent's frames (a thread waiting for one, or the
background reader), and the requests awaiting replies."""

import array
import os
import select
import socket
import threading

from . import _frame as fr
from ._wait import NOT_READY, Waitable
from .errors import AgentGoneError, from_code


class Call(Waitable):
    """A request's reply, awaited; a blocked waiter reads session's socket
    for it. complete is the reply's callback (Session.request); subclasses
    that do more when the reply comes (a vconn's operation gives its
    window slot back, a dial registers its vconn) override it and end in
    settle."""

    def __init__(self, session=None):
        super().__init__()
        self._leads = session
        self.done = False
        self.frame = None
        self.err = None

    def settle(self, f, err):
        """Completes the call with the reply f, or the failure err, and
        wakes its waiters: the one place a call completes."""
        with self._cond:
            self.done, self.frame, self.err = True, f, err
            self._wake()

    complete = settle

    def abandon(self, s, req):
        """The caller stopped waiting (Session.call): the reply, if it
        comes, is ignored."""
        s.forget(req)

    def check(self):
        if not self.done:
            return NOT_READY
        if self.err is not None:
            raise self.err
        return self.frame


class Handle(Waitable):
    """A vconn or a listener: handle of a session, which fails it (_fail)
    when it breaks, and resets it in a forked child. Its timeout is the
    default of its calls that wait."""

    def __init__(self, s, handle):
        super().__init__()
        self._s = self._leads = s
        self.handle = handle
        self._timeout = None
        self._err = None  # why it failed; guarded by _cond

    def settimeout(self, timeout):
        """None: block; 0: non-blocking; else seconds each call may wait."""
        if timeout is not None and timeout < 0:
            raise ValueError(f"timeout {timeout}: want None or at least 0")
        self._timeout = timeout

    def gettimeout(self):
        return self._timeout

    def _t(self, timeout):
        return self._timeout if timeout is None else timeout

    def _fail(self, err):
        with self._cond:
            if self._err is None:
                self._err = err
            self._wake()


# The background reader's standby after a thread of the program waited:
# doubling while they keep waiting (libvconn does the same, cv_wait).
_STANDBY_MIN, _STANDBY_MAX = 0.002, 0.064

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
    vconns and listeners) and reply callbacks run on the thread reading
    the socket and must not block.

    The socket has one reader at a time: a thread blocked in a wait reads
    it itself (_try_lead), and hands it on when its wait ends; a reader
    thread that handed every frame to its waiter cost a second thread's
    wake-up a frame, and on a virtual machine waking an idle core costs
    about 20 us. The background reader reads while no thread waits (it
    stands by for 2 to 64 ms after one did), and always once a coroutine
    or a select loop waits (_set_async)."""

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
        self.features = 0  # what the agent offers (Hello's arg2: fr.FEATURE_*)
        # The descriptors of the frame being dispatched, for its reply's
        # callback to take (take_rights); the rest are closed after it.
        self._rights = []
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
        self._init_lead()
        self._reader = threading.Thread(target=self._read, name="rdmavisor-session", daemon=True)
        self._reader.start()

    def _init_lead(self):
        # Guarded by _lead_lock, which a waitable's _cond may hold when it
        # is taken (never the other way round).
        self._lead_lock = threading.Lock()
        self._bg_cond = threading.Condition(self._lead_lock)
        self._leader = None  # "bg", or the leading thread's ident
        self._leading_for = None  # the Waitable whose wait leads
        self._kicked = False
        self._waiters = set()  # Waitables with a thread asleep in _block
        self._app_gen = 0  # counts the program's waits
        self._async = False
        self._frames = 0  # frames read, and those the background reader read
        self.bg_frames = 0
        self._kick_r, self._kick_w = socket.socketpair()
        self._kick_r.setblocking(False)
        self._kick_w.setblocking(False)
        self._poller = select.poll()  # used by the leader only
        self._poller.register(self._sock.fileno(), select.POLLIN)
        self._poller.register(self._kick_r.fileno(), select.POLLIN)

    def _kick(self):
        try:
            self._kick_w.send(b"\0")
        except OSError:  # full: a kick is pending anyway
            pass

    def _try_lead(self, w):
        """Whether the thread blocked on w reads the socket now; if not, w
        is registered to be told when it may (_handoff). w._cond held."""
        with self._lead_lock:
            self._app_gen += 1
            if self._leader is None and not self._async and self.err is None:
                self._leader, self._leading_for = threading.get_ident(), w
                return True
            if self._leader == "bg" and not self._async and not self._kicked:
                self._kicked = True  # the background reader stands by for this thread
                self._kick()
            self._waiters.add(w)
            return False

    def _wait_end(self, w):
        with self._lead_lock:
            self._waiters.discard(w)

    def _unlead(self):
        """Ends a leader's turn and wakes one waiter to lead next."""
        with self._lead_lock:
            self._leader, self._leading_for, self._kicked = None, None, False
        self._pass_on()

    def _pass_on(self):
        """Wakes one waiter to lead while none does: after a turn, and when
        a wait ends (a waiter woken to lead whose wait was over meanwhile
        passes it on). No _cond held: a waitable's _cond is taken here."""
        with self._lead_lock:
            if self._leader is not None:
                return
            w = next(iter(self._waiters), None)
        if w is not None:
            with w._cond:
                w._cond.notify_all()

    def _kick_for(self, w):
        """w's state changed (w._cond held): if another thread reads the
        socket for w, its poll must look again."""
        with self._lead_lock:
            if self._leading_for is w and self._leader != threading.get_ident():
                self._kick()

    def _set_async(self):
        with self._lead_lock:
            if self._async:
                return
            self._async = True
            self._bg_cond.notify()
            if self._leader not in (None, "bg"):
                self._kick()

    def _lead(self, timeout, only_ready=False):
        """Reads and dispatches at most one frame, waiting up to timeout
        seconds (None: until a frame or a kick); False once the session
        ended, or with only_ready when no frame was there."""
        ms = None if timeout is None else 0 if only_ready else max(1, int(timeout * 1000 + 0.999))
        try:
            ready = self._poller.poll(ms)
        except InterruptedError:
            return not only_ready
        got = False
        for fd, _ in ready:
            if fd == self._kick_r.fileno():
                try:
                    self._kick_r.recv(64)
                except OSError:
                    pass
            else:
                got = True
        if not got:
            return not only_ready
        return self._read_frame()

    def hello(self, timeout):
        call = Call(self)
        self.request(fr.Frame(fr.OP_HELLO, arg=fr.VERSION), call.complete)
        try:
            f = call._block(call.check, timeout, "hello")
            if f.arg != fr.VERSION:
                raise fr.FrameError(f"the agent answered with protocol version {f.arg}, this client speaks {fr.VERSION}")
            self.info = fr.decode_hello(f.payload)
            self.features = f.arg2
        except fr.FrameError as e:
            err = AgentGoneError(f"hello: {e}")
            self.shutdown(err)
            raise err from None
        except BaseException as e:
            self.shutdown(AgentGoneError(f"hello: {e}"))
            raise
        return self.info

    def alive(self):
        """Whether the session works, once what the agent sent meanwhile
        was read when no thread reads the socket: a hang-up after an
        answer nobody else waited for is seen here."""
        if self.err is None:
            self._read_pending()
        return self.err is None

    def _read_pending(self):
        with self._lead_lock:
            if self._leader is not None or self._async:
                return
            self._leader = threading.get_ident()
        try:
            while self._lead(0, only_ready=True):
                pass
        finally:
            self._unlead()

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
        req = self.register(cb, check=True)
        try:
            self.write(f._replace(req=req))
        except Exception:
            with self._lock:
                mine = self._pending.pop(req, None) is not None
            if mine:
                raise
            # The failure was delivered to cb already.
        return req

    def register(self, cb, check=False):
        """A new req whose reply (or the session's failure) goes to
        cb(frame, err); with check, the session's failure is raised
        instead once it broke."""
        with self._lock:
            if check and self.err is not None:
                raise self.err
            self._next_req = (self._next_req + 1) & 0xFFFFFFFF or 1
            req = self._next_req
            self._pending[req] = cb
        return req

    def forget(self, req):
        """Drops a request whose caller stopped waiting (its reply, if it
        comes, is ignored)."""
        with self._lock:
            return self._pending.pop(req, None)

    def call(self, f, timeout, what, c=None):
        """Sends f and waits for its reply; c, a Call of this session, is
        what the reply completes (default: a plain Call)."""
        c = Call(self) if c is None else c
        req = self.request(f, c.complete)
        try:
            return c._block(c.check, timeout, what)
        except BaseException:
            c.abandon(self, req)
            raise

    async def acall(self, f, timeout, what, c=None):
        """call, for asyncio."""
        c = Call(self) if c is None else c
        req = self.request(f, c.complete)
        try:
            return await c._await(c.check, timeout, what)
        except BaseException:
            c.abandon(self, req)
            raise

    def _read(self):
        """The background reader: leads while no thread of the program
        waits, and always once _async."""
        seen, standby = -1, _STANDBY_MIN
        while True:
            with self._bg_cond:
                while True:
                    if self.err is not None:
                        return
                    if not self._async and (self._leader is not None or self._waiters or self._app_gen != seen):
                        seen = self._app_gen
                        self._bg_cond.wait(standby)
                        standby = min(standby * 2, _STANDBY_MAX)
                    elif self._leader is not None:  # async now: the program's leader was kicked
                        self._bg_cond.wait(_STANDBY_MIN)
                    else:
                        self._leader, standby = "bg", _STANDBY_MIN
                        break
            before = self._frames
            try:
                alive = self._lead(None)
            finally:
                self._unlead()
            self.bg_frames += self._frames - before  # for tests: who reads
            if not alive:
                return

    def _read_frame(self):
        """Reads and dispatches one frame if one is there (the caller
        leads); False once the session ended."""
        fdspace = socket.CMSG_SPACE(8 * array.array("i").itemsize)
        try:
            data, anc, _, _ = self._sock.recvmsg(fr.MAX_FRAME + 1, fdspace, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError as e:
            self.shutdown(AgentGoneError(f"read from the agent: {e}"))
            return False
        fds = _fds_of(anc)
        if not data:
            _close(fds)
            msg = "the agent closed the connection"
            if self._hangup is not None:
                msg += f" after {self._hangup}"
            self.shutdown(AgentGoneError(msg))
            return False
        try:
            f = fr.decode(data)
        except fr.FrameError as e:
            _close(fds)
            self.shutdown(AgentGoneError(f"protocol error: {e}"))
            return False
        self._frames += 1  # by the leader only
        self._rights = fds
        try:
            self._dispatch(f)
        except Exception as e:  # a bug here must not leave callers waiting forever
            self.shutdown(AgentGoneError(f"dispatching {f.op}: {e!r}"))
            return False
        finally:
            # Descriptors no callback took (only Stage's OK carries one this
            # package asks for) are closed, as the protocol wants (R1.3).
            fds, self._rights = self._rights, []
            _close(fds)
        return True

    def take_rights(self):
        """The descriptors of the reply being dispatched, now the caller's
        to close: only a reply's callback (on the reading thread) calls it."""
        fds, self._rights = self._rights, []
        return fds

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
        with self._bg_cond:
            self._bg_cond.notify()  # a background reader standing by ends now
        if threading.current_thread() is not self._reader:
            self._reader.join(5)
        self._sock.close()
        self._kick_r.close()
        self._kick_w.close()
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
        self._lead_lock = threading.Lock()
        self._bg_cond = threading.Condition(self._lead_lock)
        self._leader, self._leading_for, self._waiters, self._async = None, None, set(), True
        self.err = err
        for k in (self._kick_r, self._kick_w):
            try:
                k.close()  # the child's descriptors only
            except OSError:
                pass
        conns, lns = list(self.conns.values()), list(self.listeners.values())
        self._pending, self.conns, self.listeners = {}, {}, {}
        try:
            self._sock.close()  # the child's descriptor only
        except OSError:
            pass
        for x in conns + lns:
            x._reset_after_fork()
            x._fail(err)


def _fds_of(anc):
    """The descriptors an SCM_RIGHTS control message passed."""
    out = []
    for level, kind, data in anc:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds = array.array("i")
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
            out.extend(fds)
    return out


def _close(fds):
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
