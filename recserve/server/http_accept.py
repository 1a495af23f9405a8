"""A listener that accepts every waiting connection each time the event loop looks.

libuv (uvloop's core) accepts one connection per loop iteration since 1.45 (libuv PR
#3696), which is cheap when iterations are short. recserve's loop runs short predictions
inline, so under load an iteration lasts tens of ms, and a burst of new connections waits
one iteration each: measured, 64 clients connecting at once to a busy server got their
first answers in a staircase of ~20 ms steps up to 1 s (max 80 ms with asyncio's own loop,
which accepts up to its backlog per readiness). `GreedyListener` accepts up to `batch`
connections per readiness and hands each to the loop as an accepted socket; it has the
close()/wait_closed() that uvicorn's shutdown calls on its servers.

close() first accepts what the kernel has already queued, then closes the socket: a
connection in the accept queue has completed its handshake and its client has sent the
request, and closing the socket over it resets it unanswered. After close() the port
refuses connections (a load balancer retries those elsewhere); only a handshake completing
between the last accept and the close is still reset (measured: at most 1 per stop).

Event loop only.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable

__all__ = ["GreedyListener"]

log = logging.getLogger("recserve.server")

# Out of file descriptors or memory: the connection stays in the kernel's accept queue;
# accepting pauses for a second rather than spin.
_RESOURCE_ERRORS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
_RETRY_SECONDS = 1.0  # as asyncio's own servers wait
# More than any accept queue holds (the kernel caps listen()'s backlog at somaxconn, 4096
# by default): close() empties the queue whatever its length.
_BACKLOG_MAX = 65536


class GreedyListener:
    def __init__(self, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol],
                 loop: asyncio.AbstractEventLoop, batch: int = 512) -> None:
        self._sock = sock
        self._factory = protocol_factory
        self._loop = loop
        self._batch = batch
        self._closed = False
        self._connecting: set[asyncio.Task[None]] = set()  # referenced until done (asyncio keeps weak ones)
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        self._take(self._batch)

    def _take(self, limit: int) -> None:
        for _ in range(limit):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno in _RESOURCE_ERRORS:
                    # The listener stays readable: without a pause the loop would spin on it.
                    log.warning("HTTP: cannot accept connections for %.0f s: %s", _RETRY_SECONDS, exc.strerror)
                    self._loop.remove_reader(self._sock.fileno())
                    self._loop.call_later(_RETRY_SECONDS, self._resume)
                    return
                raise
            conn.setblocking(False)
            task = self._loop.create_task(self._connect(conn))
            self._connecting.add(task)
            task.add_done_callback(self._connecting.discard)

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:  # the client went away before its transport was made
            conn.close()

    def close(self) -> None:
        """Stop listening: accept the connections already queued (served like any other),
        then close the socket, so the port refuses new ones instead of queueing them."""
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._sock.fileno())
        try:
            self._take(_BACKLOG_MAX)
        finally:
            self._sock.close()

    async def wait_closed(self) -> None:
        """Return once every accepted connection has its transport (and so is among the
        server's connections, which shutdown asks to finish)."""
        while self._connecting:
            await asyncio.gather(*self._connecting, return_exceptions=True)
