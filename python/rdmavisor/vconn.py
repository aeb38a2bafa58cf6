"""The package's API in one module, as it was before the package was split
by concern: Client, VConn, Listener, Region and their constants, from the
modules that hold them. It defines nothing; the modules import in one
direction only, each from those before it:

    errors, _frame      the errors; the pod protocol's frames
    _wait               waiting for a waitable's state: threads and coroutines
    _session            the session: its socket, the reader hand-off, the
                        requests and their calls (Call.settle: the one place
                        a call completes), and Handle, a vconn's or a
                        listener's failure and timeout
    _addr               "host:port", and resolving a dial's host
    _stage              staging memory: the bytes of the one-sided operations
                        on the peer's regions, where the agent offers it
    _region             Region, and the one-sided transfers in frames
    _conn               VConn: dialled (Dial) or accepted, its stream and
                        messages, its window of operations (_OpCall), close
    _listener           Listener
    _client             Client: its session, dial and listen, fork
    vconn, __init__     these names
"""

from ._addr import join_addr, split_addr
from ._client import ENV_SOCKET, Client
from ._conn import CLOSE_TIMEOUT, RECV_WINDOW, Message, VConn
from ._listener import Listener
from ._region import ACCESS_READ, ACCESS_WRITE, Region
from ._session import Session
from ._wait import NOT_READY, Waitable
from .errors import (AgentGoneError, BadRequestError, ClosedError, NoHandleError, NotStreamError,
                     TooLargeError, UnknownHostError, VConnError)

__all__ = ["ACCESS_READ", "ACCESS_WRITE", "CLOSE_TIMEOUT", "ENV_SOCKET", "RECV_WINDOW", "Client", "Listener",
           "Message", "NOT_READY", "Region", "Session", "VConn", "Waitable", "join_addr", "split_addr",
           "AgentGoneError", "BadRequestError", "ClosedError", "NoHandleError", "NotStreamError", "TooLargeError",
           "UnknownHostError", "VConnError"]
