"""The frame codec against the Go one's rules (internal/frame), without an agent."""

import struct

import pytest

from rdmavisor import _frame as fr


def test_round_trip():
    f = fr.Frame(fr.OP_SEND, fr.FLAG_IMM, 7, 3, 0xDEADBEEF, 1 << 40, b"payload")
    b = fr.encode(f)
    assert len(b) == fr.HEADER_LEN + 7
    assert b[:2] == bytes([1, fr.OP_SEND])
    assert fr.decode(b) == f


def test_header_layout_is_big_endian():
    b = fr.encode(fr.Frame(fr.OP_DIAL, 0, 0x01020304, 0x05060708, 0x090A0B0C, 0x0D0E0F1011121314, b"xy"))
    assert b.hex() == "0103000001020304050607080" "90a0b0c0d0e0f10111213140000000278" "79"


@pytest.mark.parametrize("b, why", [
    (b"\x01\x04", "shorter than its header"),
    (bytes([2, fr.OP_SEND]) + bytes(26), "unsupported version 2"),
    (bytes([1, 0]) + bytes(26), "unknown op 0"),
    (bytes([1, 20]) + bytes(26), "unknown op 20"),
    (bytes([1, fr.OP_SEND, 0, 2]) + bytes(24), "unknown flags 0x2"),
    (bytes([1, fr.OP_SEND]) + bytes(22) + struct.pack(">I", 1), "length does not match"),
    (bytes([1, fr.OP_SEND]) + bytes(22) + struct.pack(">I", fr.MAX_PAYLOAD + 1), "larger than MaxPayload"),
], ids=["short", "version", "op0", "op20", "flags", "length", "too-big"])
def test_decode_refuses(b, why):
    with pytest.raises(fr.FrameError, match=why):
        fr.decode(b)


def test_encode_refuses_oversized_payload():
    with pytest.raises(ValueError):
        fr.encode(fr.Frame(fr.OP_SEND, payload=bytes(fr.MAX_PAYLOAD + 1)))


def test_hello_info():
    p = struct.pack(">III", 8, 16, 65536) + b"node-a"
    assert fr.decode_hello(p) == fr.HelloInfo(8, 16, 65536, "node-a")
    with pytest.raises(fr.FrameError):
        fr.decode_hello(p[:11])


def test_vconn_info():
    assert fr.vconn_info(3 << 32 | 4000) == ("ud", 4000)
    assert fr.vconn_info(0) == ("", 0)
    assert fr.reliable("") and fr.reliable("rc") and fr.reliable("auto")
    assert not fr.reliable("uc") and not fr.reliable("ud") and not fr.reliable("transport(9)")


def test_staged_write_golden():
    """A Write whose bytes are in staging memory, as the Go codec's golden
    frame (internal/frame: "write staged")."""
    f = fr.Frame(fr.OP_WRITE, fr.FLAG_MEMFD, 5, 1, 2, 0x10, fr.encode_staged(0x10000, 0x2000))
    assert fr.encode(f).hex() == ("010b0004" "00000005" "00000001" "00000002" "0000000000000010" "00000008"
                                  "0001000000002000")
