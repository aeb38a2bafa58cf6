"""The client: an application's connection to its node agent (a Session,
connected again after it broke), dial and listen, and fork's hand-over
(Go: pkg/vconn/client.go)."""

import ipaddress
import os
import threading
import time
import weakref

from . import _frame as fr
from ._addr import dial_addr, join_addr, resolve, split_addr
from ._conn import Dial, accepted
from ._listener import Listener
from ._session import Call, Session
from .errors import AgentGoneError, BadRequestError, ClosedError, UnknownHostError, VConnError

ENV_SOCKET = "RDMAVISOR_SOCKET"


_clients = weakref.WeakSet()


def _after_fork_in_child():
    for c in list(_clients):
        c._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _hello_info(field, doc):
    """A property of Client: field of the agent's hello (HelloInfo)."""
    return property(lambda self: getattr(self._info(), field), doc=doc)


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
            s = Session(self.socket_path, accepted)
            s.hello(self.timeout)
            self._s = s
            return s

    def _info(self):
        return self._session().info

    quota = _hello_info("quota", "The number of vconns the agent lets this allocation hold open.")
    node = _hello_info("node", "The agent's node name.")
    send_window = _hello_info("send_window", "Operations of one vconn that may be unanswered by the agent.")
    max_message = _hello_info("max_message", "The largest message of any vconn (each has its own: VConn.max_message).")

    def dial(self, addr, *, timeout=None):
        """Connects a vconn to the listener at "host:port": a pod's IP, a
        node's name or IP (its host services), or a name the agent does not
        know, which is resolved (DNS) and dialled IP by IP."""
        timeout = self.timeout if timeout is None else timeout
        host, port = dial_addr(addr)
        try:
            return self._dial(addr, timeout)
        except UnknownHostError as e:
            ips = resolve(host, e)
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
        host, port = dial_addr(addr)
        try:
            return await self._adial(addr, timeout)
        except UnknownHostError as e:
            ips = resolve(host, e)
        errs = []
        for ip in ips:
            try:
                return await self._adial(join_addr(ip, port), timeout)
            except VConnError as err:
                errs.append(err)
        raise type(errs[-1])(f"dial {addr} ({len(ips)} IPs): " + "; ".join(str(x) for x in errs))

    def _dial(self, addr, timeout):
        s = self._session()
        d = Dial(s, addr)
        s.call(fr.Frame(fr.OP_DIAL, payload=addr.encode()), timeout, f"dial {addr}", d)
        return d.started()

    async def _adial(self, addr, timeout):
        s = self._session()
        d = Dial(s, addr)
        await s.acall(fr.Frame(fr.OP_DIAL, payload=addr.encode()), timeout, f"dial {addr}", d)
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
        c = Call(s)
        req = s.register(c.complete)
        if len(data) >= 8:
            data[4:8] = req.to_bytes(4, "big")
        # Else there is no room for a req: the agent answers with req 0,
        # then hangs up, which completes the call with the reason.
        s.write_raw(bytes(data))
        try:
            return c._block(c.check, self.timeout if timeout is None else timeout, "raw frame")
        finally:
            # The agent hangs up just after its answer: wait for it, so
            # that the next dial finds this session broken rather than
            # writing into a socket about to close.
            deadline = time.monotonic() + 5
            while s.alive() and time.monotonic() < deadline:
                time.sleep(0.001)
