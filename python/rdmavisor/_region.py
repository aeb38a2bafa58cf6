"""Regions: memory a vconn exported to its peer, and the one-sided
operations' transfers in frames of at most MAX_PAYLOAD bytes, for this
side's regions and the peer's (Go: pkg/vconn/region.go). A region's
operations are its vconn's (VConn.op): this module imports no vconn."""

from . import _frame as fr

ACCESS_READ = 1
ACCESS_WRITE = 2


def read_chunks(conn, op, region_id, offset, n, timeout, what):
    """n bytes of a region at offset, in reads of at most MAX_PAYLOAD
    (op: OP_LOCAL_READ for this side's region, OP_READ for the peer's)."""
    out = bytearray()
    while len(out) < n:
        k = min(n - len(out), fr.MAX_PAYLOAD)
        rep = conn.op(fr.Frame(op, arg=region_id, arg2=offset + len(out), payload=fr.encode_length(k)),
                      timeout, what)
        out += conn._s.exact(rep, k, what)
    return bytes(out)


def write_chunks(conn, op, region_id, offset, data, timeout, what):
    """Writes data into a region at offset, in writes of at most
    MAX_PAYLOAD (op: OP_LOCAL_WRITE or OP_WRITE)."""
    view = memoryview(data).cast("B")
    for i in range(0, len(view), fr.MAX_PAYLOAD):
        conn.op(fr.Frame(op, arg=region_id, arg2=offset + i, payload=bytes(view[i:i + fr.MAX_PAYLOAD])),
                timeout, what)


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
        return read_chunks(self._c, fr.OP_LOCAL_READ, self.id, offset, n, timeout, f"region {self.id}")

    def write(self, offset, data, *, timeout=None):
        write_chunks(self._c, fr.OP_LOCAL_WRITE, self.id, offset, data, timeout, f"region {self.id}")

    def close(self, *, timeout=None):
        """Withdraws the export (its memory is freed once the peer confirmed)."""
        self._c.op(fr.Frame(fr.OP_UNEXPORT, arg=self.id), timeout, f"unexport region {self.id}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
