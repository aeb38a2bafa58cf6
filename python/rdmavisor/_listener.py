"""Listeners: a session's listener, and the accepted vconns it holds
until they are taken (Go: pkg/vconn/listener.go)."""

from . import _conn
from . import _frame as fr
from ._session import Handle
from ._wait import NOT_READY
from .errors import AgentGoneError, ClosedError, NoHandleError


class Listener(Handle):
    """Accepts vconns dialled to its port."""

    def __init__(self, s, handle, address):
        super().__init__(s, handle)
        self.address = address  # "podIP:port", or "node:port" for host services
        self._q = []  # guarded by _cond
        self._closed = False

    def __repr__(self):
        return f"<Listener {self.address}>"

    def _push(self, c):
        with self._cond:
            if not self._closed:
                self._q.append(c)
                self._wake()
                return
        c._close_async()

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
        return self._block(self._next, self._t(timeout), "accept")

    async def aaccept(self, *, timeout=None):
        return await self._await(self._next, self._t(timeout), "accept")

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
            self._s.call(fr.Frame(fr.OP_CLOSE, handle=self.handle), _conn.CLOSE_TIMEOUT, "close listener")
        except (AgentGoneError, NoHandleError):
            pass
        finally:
            with self._s._lock:
                self._s.listeners.pop(self.handle, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
