"""A program that forks keeps working in both processes; the asyncio API."""

import asyncio
import os

import pytest

import rdmavisor


def test_fork(agents, echo_server):
    c = agents.client("node-a")
    v = c.dial(echo_server)
    v.sendall(b"before")
    assert v.recv_exactly(6, timeout=10) == b"before"
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        code = 1
        try:
            os.close(r)
            try:
                v.sendall(b"child on the parent's vconn")
                msg = b"FAIL: the parent's vconn worked in the child"
            except rdmavisor.AgentGoneError as e:
                assert "fork" in str(e), e
                with c.dial(echo_server) as mine:  # the child's own connection
                    mine.sendall(b"child")
                    assert mine.recv_exactly(5, timeout=10) == b"child"
                msg, code = b"ok", 0
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            msg = f"FAIL: {e!r}".encode()
        finally:
            os.write(w, msg)
            os._exit(code)
    os.close(w)
    report = b""
    while chunk := os.read(r, 4096):
        report += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert report == b"ok" and os.waitstatus_to_exitcode(status) == 0, report
    # The parent's vconn and client are untouched by the child.
    v.sendall(b"after")
    assert v.recv_exactly(5, timeout=10) == b"after"
    with c.dial(echo_server) as v2:
        v2.sendall(b"parent")
        assert v2.recv_exactly(6, timeout=10) == b"parent"
    v.close()
    c.close()


def test_asyncio(agents, port):
    server = agents.client("node-b")
    client = agents.client("node-a")

    async def serve(ln):
        v = await ln.aaccept(timeout=10)
        while True:
            m = await v.arecv_message(timeout=10)
            if m is None:
                break
            await v.asend_message(m.data.upper(), m.imm)
        await v.aclose()

    async def main():
        ln = await server.alisten(port)
        task = asyncio.create_task(serve(ln))
        async with await client.adial(f"node-b:{port}") as v:
            for i in range(50):
                await v.asend_message(b"msg %d" % i, i)
            for i in range(50):
                assert await v.arecv_message(timeout=10) == rdmavisor.Message(b"MSG %d" % i, i)
            with pytest.raises(TimeoutError):
                await v.arecv_message(timeout=0.05)
            # Many coroutines wait at once, each woken by its reply.
            await asyncio.gather(*(v.asend_message(b"x") for _ in range(40)))
            for _ in range(40):
                assert (await v.arecv(10, timeout=10)) == b"X"
        await task
        with pytest.raises(rdmavisor.RefusedError):
            await client.adial(f"node-b:{port + 5000}")
        ln.close()

    asyncio.run(main())
    client.close()
    server.close()
