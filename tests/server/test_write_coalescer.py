"""Fast-lane answers written together at the end of the loop's pass
(recserve.server.write_coalescer), over real sockets on a real event loop."""

from __future__ import annotations

import asyncio
import socket
import time

import uvloop

from recserve.server.write_coalescer import MAX_HOLD_SECONDS, WriteCoalescer


def _received(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except BlockingIOError:
        return b""


async def _transports(n: int) -> tuple[list[asyncio.Transport], list[socket.socket]]:
    loop = asyncio.get_running_loop()
    transports, peers = [], []
    for _ in range(n):
        ours, theirs = socket.socketpair()
        theirs.setblocking(False)
        transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, ours)
        transports.append(transport)
        peers.append(theirs)
    return transports, peers


def test_answers_are_held_until_the_pass_ends_then_written_in_order() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        (a, b, gone), (peer_a, peer_b, peer_gone) = await _transports(3)
        writes = WriteCoalescer()
        seen: list[bytes] = []

        def one_pass() -> None:  # answers made in one pass of the loop over ready connections
            writes.write(loop, a, b"first ")
            writes.write(loop, b, b"other")
            writes.write(loop, gone, b"lost")
            writes.write(loop, a, b"second")
            gone.close()  # its client went away before the pass ended
            seen.append(_received(peer_a))

        loop.call_soon(one_pass)
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == [b""]  # nothing was written while the pass ran
        assert _received(peer_a) == b"first second"  # the same connection's answers in order
        assert _received(peer_b) == b"other"
        assert _received(peer_gone) == b""  # closed meanwhile: nothing written to it
        for transport in (a, b):
            transport.close()

    uvloop.run(main())


def test_an_answer_held_past_the_limit_is_written_at_once() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        (a, b), (peer_a, peer_b) = await _transports(2)
        writes = WriteCoalescer()
        seen: list[bytes] = []

        def long_pass() -> None:
            writes.write(loop, a, b"early")
            began = time.perf_counter()
            while time.perf_counter() - began < 2 * MAX_HOLD_SECONDS:  # a long run in the same pass
                pass
            writes.write(loop, b, b"late")  # the first held answer waited long enough: both go now
            seen.extend((_received(peer_a), _received(peer_b)))

        loop.call_soon(long_pass)
        for _ in range(20):
            await asyncio.sleep(0)
        assert seen == [b"early", b"late"]
        for transport in (a, b):
            transport.close()

    uvloop.run(main())
