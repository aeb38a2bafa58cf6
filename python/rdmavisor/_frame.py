"""The pod protocol's frames (Go: internal/frame), encoded and decoded.

Every frame is one SOCK_SEQPACKET datagram: a 28-byte big-endian header,
then at most MAX_PAYLOAD bytes of payload::

    version u8 | op u8 | flags u16 | req u32 | handle u32 | arg u32 | arg2 u64 | length u32
"""

import struct
from typing import NamedTuple

VERSION = 1
HEADER_LEN = 28
MAX_PAYLOAD = 64 << 10
MAX_FRAME = HEADER_LEN + MAX_PAYLOAD

_HEADER = struct.Struct(">BBHIIIQI")

# Operations.
OP_HELLO = 1
OP_LISTEN = 2
OP_DIAL = 3
OP_SEND = 4
OP_GRANT = 5
OP_CLOSE = 6
OP_EXPORT = 7
OP_UNEXPORT = 8
OP_LOCAL_READ = 9
OP_LOCAL_WRITE = 10
OP_WRITE = 11
OP_READ = 12
OP_OK = 13
OP_ERROR = 14
OP_DATA = 15
OP_EOF = 16
OP_ACCEPT = 17
OP_SHM = 18
OP_STAGE = 19
_OP_LIMIT = 20

FLAG_IMM = 1
# On Write and Read (where FEATURE_STAGE is offered): the bytes are in the
# vconn's staging memory, at the span the payload names (encode_staged).
FLAG_MEMFD = 4

# Features the agent offers: bits of its Hello OK's arg2 (0 from an agent
# that predates them, which ends the session over an op it does not know).
FEATURE_MEMFD = 1
FEATURE_STAGE = 2

# Transports, as VConnInfo (arg2 of a Dial's reply and of Accept) numbers them.
TRANSPORTS = {0: "", 1: "rc", 2: "uc", 3: "ud", 4: "auto"}


class FrameError(ValueError):
    """A datagram that is not a frame of this protocol version."""


class Frame(NamedTuple):
    op: int
    flags: int = 0
    req: int = 0
    handle: int = 0
    arg: int = 0
    arg2: int = 0
    payload: bytes = b""


def encode(f: Frame) -> bytes:
    """Encodes f; a payload longer than MAX_PAYLOAD is a ValueError."""
    if len(f.payload) > MAX_PAYLOAD:
        raise ValueError(f"frame payload of {len(f.payload)} bytes, at most {MAX_PAYLOAD}")
    return _HEADER.pack(VERSION, f.op, f.flags, f.req, f.handle, f.arg, f.arg2, len(f.payload)) + bytes(f.payload)


def decode(b: bytes) -> Frame:
    """Parses one datagram as the Go SDK does (frame.Decode)."""
    if len(b) < HEADER_LEN:
        raise FrameError(f"frame: shorter than its header: {len(b)} bytes")
    version, op, flags, req, handle, arg, arg2, n = _HEADER.unpack_from(b)
    if version != VERSION:
        raise FrameError(f"frame: unsupported version {version}")
    if op == 0 or op >= _OP_LIMIT:
        raise FrameError(f"frame: unknown op {op}")
    if flags & ~FLAG_IMM:
        raise FrameError(f"frame: unknown flags {flags:#x}")
    if n > MAX_PAYLOAD:
        raise FrameError(f"frame: payload larger than MaxPayload: {n} bytes")
    if n != len(b) - HEADER_LEN:
        raise FrameError(f"frame: length does not match the datagram: header says {n}, datagram has {len(b) - HEADER_LEN}")
    return Frame(op, flags, req, handle, arg, arg2, bytes(b[HEADER_LEN:]))


class HelloInfo(NamedTuple):
    quota: int
    send_window: int
    max_message: int
    node: str


def decode_hello(p: bytes) -> HelloInfo:
    if len(p) < 12 or len(p) > 12 + 253:
        raise FrameError(f"frame: bad payload: hello info of {len(p)} bytes")
    quota, window, maxmsg = struct.unpack_from(">III", p)
    return HelloInfo(quota, window, maxmsg, p[12:].decode("utf-8", "replace"))


def encode_length(n: int) -> bytes:
    """The u32 length payload of LocalRead and Read."""
    return struct.pack(">I", n)


def encode_staged(off: int, n: int) -> bytes:
    """The payload of a Write or Read with FLAG_MEMFD: n bytes of the
    staging memory at off."""
    return struct.pack(">II", off, n)


def vconn_info(arg2: int):
    """Decodes VConnInfo: (transport name, max message; 0 when unknown)."""
    t = (arg2 >> 32) & 0xFF
    return TRANSPORTS.get(t, f"transport({t})"), arg2 & 0xFFFFFFFF


def reliable(transport: str) -> bool:
    """Whether a transport delivers every message once, whole and in order."""
    return transport in ("", "rc", "auto")
