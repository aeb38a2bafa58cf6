"""E6's program over the Python package (rdmavisor, on the socket: the
package has no shared memory), run by test/ladder between two agents. It
speaks what clib/test/ladder.h describes, with vconn messages
(send_message, recv_message):

    python3 ladder.py server PORT       listens, serves one client, exits
    python3 ladder.py client HOST:PORT  dials, runs the commands on stdin

The allocation's socket is $RDMAVISOR_SOCKET.
"""

import struct
import sys
import time

import rdmavisor

ECHO, SINK, QUIT = 1, 2, 3
HEADER = struct.Struct("<IIQ")
SEQ = struct.Struct("<Q")


def get(v, n):
    m = v.recv_message()
    if m is None:
        return None
    if len(m.data) != n:
        sys.exit(f"error: a message of {len(m.data)} bytes, want {n}")
    return m.data


def serve(v):
    while True:
        h = get(v, HEADER.size)
        if h is None:
            return
        op, size, count = HEADER.unpack(h)
        if op == QUIT:
            return
        if op == ECHO:
            for _ in range(count):
                m = get(v, size)
                if m is None:
                    sys.exit("error: the client hung up inside a command")
                v.send_message(m)
        elif op == SINK:
            wrong = 0
            for i in range(count):
                m = get(v, size)
                if m is None:
                    sys.exit("error: the client hung up inside a command")
                if SEQ.unpack_from(m)[0] != i:
                    wrong += 1
            v.send_message(struct.pack("<QQ", count * size, wrong))
        else:
            sys.exit(f"error: bad header op {op}")


def fill(seq, size):
    """Message seq of an echo: its number, then bytes that depend on it
    and on their place (ladder.h's ladder_fill)."""
    return SEQ.pack(seq) + bytes((seq * 7 + i) & 0xFF for i in range(8, size))


def pingpong(v, size, inflight, count):
    now = time.perf_counter_ns
    msgs = [fill(i, size) for i in range(count)]  # made before the clock starts
    sent = [0] * count
    rtt = [0] * count
    v.send_message(HEADER.pack(ECHO, size, count))
    t0 = now()
    nxt = 0
    for got in range(count):
        while nxt < count and nxt < got + inflight:
            sent[nxt] = now()
            v.send_message(msgs[nxt])
            nxt += 1
        m = get(v, size)
        if m is None:
            sys.exit("error: the server hung up")
        rtt[got] = now() - sent[got]
        if m != msgs[got]:
            sys.exit(f"error: echo {got} differs from what was sent")
    elapsed = now() - t0
    print("ok", elapsed, " ".join(map(str, rtt)), flush=True)


def stream(v, size, count):
    body = bytes(size - SEQ.size)
    v.send_message(HEADER.pack(SINK, size, count))
    t0 = time.perf_counter_ns()
    for i in range(count):
        v.send_message(SEQ.pack(i) + body)
    a = get(v, 16)
    elapsed = time.perf_counter_ns() - t0
    if a is None:
        sys.exit("error: the server hung up")
    got, wrong = struct.unpack("<QQ", a)
    if got != count * size or wrong:
        sys.exit(f"error: the server read {got} bytes ({wrong} messages misnumbered), want {count * size}")
    print("ok", elapsed, flush=True)


def client(v):
    for line in sys.stdin:
        f = line.split()
        if f[:1] == ["pp"] and len(f) == 4:
            pingpong(v, int(f[1]), int(f[2]), int(f[3]))
        elif f[:1] == ["st"] and len(f) == 3:
            stream(v, int(f[1]), int(f[2]))
        elif f[:1] == ["quit"]:
            v.send_message(HEADER.pack(QUIT, 0, 0))
            return
        else:
            sys.exit(f"error: bad command {line!r}")


def main():
    if len(sys.argv) != 3 or sys.argv[1] not in ("server", "client"):
        sys.exit("usage: ladder.py server PORT | ladder.py client HOST:PORT")
    with rdmavisor.Client() as c:
        if sys.argv[1] == "server":
            with c.listen(int(sys.argv[2])) as ln:
                print("ready", ln.address, flush=True)
                v = ln.accept()
            serve(v)
        else:
            v = c.dial(sys.argv[2])
            client(v)
        v.close()


if __name__ == "__main__":
    main()
