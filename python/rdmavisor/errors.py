"""Exceptions: one class per error code of the pod protocol.

Every error the agent reports is a VConnError whose ``code`` is the
protocol's; each code has its own subclass, which also derives from the
built-in exception a socket program would expect where one fits (a refused
dial is a ConnectionRefusedError, a deadline a TimeoutError).
"""

# Codes of the protocol (Go: internal/frame Code).
CODE_BAD_REQUEST = 1
CODE_VERSION = 2
CODE_QUOTA = 3
CODE_NO_HANDLE = 4
CODE_REFUSED = 5
CODE_UNREACHABLE = 6
CODE_CLOSED = 7
CODE_RESET = 8
CODE_PEER_GONE = 9
CODE_TOO_LARGE = 10
CODE_INTERNAL = 11
CODE_ADDR_IN_USE = 12
CODE_REGION = 13
CODE_WINDOW = 14
CODE_SHUTTING_DOWN = 15
CODE_LIMIT = 16
CODE_NO_ADDRESS = 17
CODE_UNKNOWN_HOST = 18
# Codes of this package, as the Go SDK numbers its own.
CODE_AGENT_GONE = 1000
CODE_NOT_STREAM = 1001
CODE_TIMEOUT = 1002


class VConnError(OSError):
    """A failure the agent reported, or of the connection to it."""

    code = 0
    name = "error"

    def __init__(self, message: str = "", code: int = None):
        if code is not None:
            self.code = code
        self.message = message
        super().__init__(str(self))

    def __str__(self):
        if self.message:
            return f"vconn: {self.name}: {self.message}"
        return f"vconn: {self.name}"

    def __reduce__(self):
        return (type(self), (self.message, self.code))


class BadRequestError(VConnError, ValueError):
    code, name = CODE_BAD_REQUEST, "bad request"


class VersionError(VConnError):
    code, name = CODE_VERSION, "unsupported version"


class QuotaError(VConnError):
    code, name = CODE_QUOTA, "vconn quota exhausted"


class NoHandleError(VConnError):
    code, name = CODE_NO_HANDLE, "no such handle"


class RefusedError(VConnError, ConnectionRefusedError):
    code, name = CODE_REFUSED, "connection refused"


class UnreachableError(VConnError):
    code, name = CODE_UNREACHABLE, "node unreachable"


class ClosedError(VConnError):
    code, name = CODE_CLOSED, "vconn closed"


class ResetError(VConnError, ConnectionResetError):
    code, name = CODE_RESET, "vconn reset by peer"


class PeerGoneError(VConnError, ConnectionAbortedError):
    code, name = CODE_PEER_GONE, "peer node gone"


class TooLargeError(VConnError):
    code, name = CODE_TOO_LARGE, "message too large"


class AgentInternalError(VConnError):
    code, name = CODE_INTERNAL, "internal error"


class AddrInUseError(VConnError):
    code, name = CODE_ADDR_IN_USE, "address in use"


class RegionError(VConnError):
    code, name = CODE_REGION, "region access denied"


class WindowError(VConnError):
    code, name = CODE_WINDOW, "send window exceeded"


class ShuttingDownError(VConnError):
    code, name = CODE_SHUTTING_DOWN, "agent shutting down"


class LimitError(VConnError):
    code, name = CODE_LIMIT, "allocation limit reached"


class NoAddressError(VConnError):
    code, name = CODE_NO_ADDRESS, "no address for the allocation's pod"


class UnknownHostError(VConnError):
    code, name = CODE_UNKNOWN_HOST, "unknown host"


class AgentGoneError(VConnError, ConnectionError):
    """The connection to the node agent broke (or was left to the parent
    process across a fork)."""

    code, name = CODE_AGENT_GONE, "agent connection lost"


class NotStreamError(VConnError):
    """recv or send on a vconn whose transport (uc, ud) may lose messages."""

    code, name = CODE_NOT_STREAM, "not a byte stream"


class DeadlineExceeded(VConnError, TimeoutError):
    """The operation's timeout (settimeout, timeout=) passed."""

    code, name = CODE_TIMEOUT, "deadline exceeded"


_BY_CODE = {cls.code: cls for cls in (
    BadRequestError, VersionError, QuotaError, NoHandleError, RefusedError, UnreachableError,
    ClosedError, ResetError, PeerGoneError, TooLargeError, AgentInternalError, AddrInUseError,
    RegionError, WindowError, ShuttingDownError, LimitError, NoAddressError, UnknownHostError,
    AgentGoneError, NotStreamError, DeadlineExceeded)}


def from_code(code: int, message: str = "") -> VConnError:
    """The exception for a protocol error code; an unknown code is a plain
    VConnError that keeps it."""
    cls = _BY_CODE.get(code)
    if cls is None:
        e = VConnError(message, code)
        e.name = f"code {code}"
        return e
    return cls(message)
