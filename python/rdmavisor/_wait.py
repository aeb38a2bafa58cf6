"""Waiting for state that the session's frames change, from a blocking
caller (a condition variable; the first one waiting reads the session's
socket itself: Session._try_lead) or a coroutine (a future the reader
resolves through the event loop's call_soon_threadsafe)."""

import asyncio
import errno
import socket
import threading
import time

from .errors import DeadlineExceeded

NOT_READY = object()


def deadline_of(timeout):
    """An absolute time.monotonic() deadline for a timeout in seconds
    (None: none; 0: do not wait)."""
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError(f"timeout {timeout}: want None or at least 0")
    return time.monotonic() + timeout


def _resolve(fut):
    if not fut.done():
        fut.set_result(None)


class Waitable:
    """State guarded by a condition: check functions run with it held and
    return NOT_READY or a result (or raise). _leads is the session whose
    socket a blocked waiter may read itself (None: it only sleeps)."""

    _leads = None

    def __init__(self):
        self._cond = threading.Condition()
        self._afuts = []  # (loop, future) of waiting coroutines; guarded by _cond
        # fileno()'s socketpair, made on first use, and whether a byte waits
        # in it (it does while _readable()); guarded by _cond.
        self._poll = None
        self._polled = False
        self._poll_closed = False

    def _reset_after_fork(self):
        # The parent's threads may have held the lock when it forked.
        self._cond = threading.Condition()
        self._afuts = []

    def _readable(self):
        """Whether a read-side call would not wait; _cond held."""
        return False

    def fileno(self):
        """A descriptor that polls readable while the next receive (or
        accept) would not wait, for select, poll and selectors; -1 once
        closed."""
        if self._leads is not None:
            self._leads._set_async()  # a select loop waits outside _block
        with self._cond:
            if self._poll is None:
                if self._poll_closed:
                    return -1
                r, w = socket.socketpair()
                r.setblocking(False)
                w.setblocking(False)
                self._poll, self._polled = (r, w), False
                self._sync_poll()
            return self._poll[0].fileno()

    def _sync_poll(self):
        """Makes fileno() readable exactly while _readable(); _cond held."""
        p = self._poll
        if p is None:
            return
        want = self._readable()
        try:
            if want and not self._polled:
                p[1].send(b"\0")
            elif not want and self._polled:
                p[0].recv(16)
        except OSError:
            return
        self._polled = want

    def _close_poll(self):
        """Closes fileno()'s descriptors; _cond held."""
        p, self._poll, self._poll_closed = self._poll, None, True
        if p is not None:
            p[0].close()
            p[1].close()

    def _wake(self):
        """Wakes every waiter; the caller holds _cond."""
        self._sync_poll()
        self._cond.notify_all()
        if self._leads is not None:
            self._leads._kick_for(self)  # a waiter reading the socket does not see notify
        for loop, fut in self._afuts:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # the loop closed: nobody waits there
                pass
        self._afuts.clear()

    def _block(self, check, timeout, what):
        s = self._leads
        try:
            return self._block_in(check, timeout, what, s)
        finally:
            if s is not None:
                s._pass_on()

    def _block_in(self, check, timeout, what, s):
        deadline = deadline_of(timeout)
        with self._cond:
            while True:
                r = check()
                if r is not NOT_READY:
                    self._sync_poll()
                    return r
                rem = None
                if deadline is not None:
                    if timeout == 0:
                        raise BlockingIOError(errno.EAGAIN, f"vconn: {what} would block")
                    rem = deadline - time.monotonic()
                    if rem <= 0:
                        raise DeadlineExceeded(f"{what}: no result within {timeout}s")
                if s is None:
                    self._cond.wait(rem)
                elif s._try_lead(self):
                    # This thread reads the next frame itself: no reader
                    # thread's wake-up between the frame and its waiter.
                    self._cond.release()
                    try:
                        s._lead(rem)
                    finally:
                        s._unlead()
                        self._cond.acquire()
                else:
                    try:
                        self._cond.wait(rem)
                    finally:
                        s._wait_end(self)

    async def _await(self, check, timeout, what):
        deadline = deadline_of(timeout)
        loop = asyncio.get_running_loop()
        if self._leads is not None:
            self._leads._set_async()  # a coroutine cannot read the socket for itself
        while True:
            with self._cond:
                r = check()
                if r is not NOT_READY:
                    self._sync_poll()
                    return r
                fut = loop.create_future()
                self._afuts.append((loop, fut))
            rem = None
            if deadline is not None:
                rem = deadline - time.monotonic()
                if rem <= 0:
                    raise DeadlineExceeded(f"{what}: no result within {timeout}s")
            try:
                await asyncio.wait_for(fut, rem)
            except asyncio.TimeoutError:
                raise DeadlineExceeded(f"{what}: no result within {timeout}s") from None
