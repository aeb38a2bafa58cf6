"""Who reads the session's socket: a thread waiting for a frame reads it
itself (no reader thread's wake-up between the frame and its waiter), and
the background reader reads what nobody waits for (as libvconn's
test_lead.c checks for C)."""

import time


def test_waiting_thread_reads_its_replies(agents, echo_server):
    with agents.client("node-a") as c, c.dial(echo_server) as v:
        s = c._session()
        v.sendall(b"warm")
        assert v.recv_exactly(4, timeout=10) == b"warm"
        before = s.bg_frames
        rounds = 300
        for i in range(rounds):
            msg = bytes([65 + i % 26]) * 32
            v.sendall(msg)
            assert v.recv_exactly(32, timeout=10) == msg
        read = s.bg_frames - before
        # A thread off a core for the reader's whole standby lets it read a
        # frame or two: a few are allowed, not most.
        assert read < rounds // 10, f"the background reader read {read} of about {2 * rounds} frames"


def test_background_reader_reads_what_nobody_waits_for(agents, echo_server):
    with agents.client("node-a") as c, c.dial(echo_server) as v:
        s = c._session()
        v.sendall(b"warm")
        assert v.recv_exactly(4, timeout=10) == b"warm"
        before = s.bg_frames
        for _ in range(8):  # within the send window: none waits for its answer
            v.send_message(b"x" * 16)
        time.sleep(0.3)  # several standbys, no call into the package
        read = s.bg_frames - before
        assert read >= 8, f"the background reader read {read} frames, want the 8 sends' answers at least"
        assert v.recv_exactly(8 * 16, timeout=10) == b"x" * 128
