"""uvicorn's HTTP protocol with the limits a public port needs: slow clients cut off, and a
bound on open connections.

uvicorn times out only idle keep-alive connections: a client that sends half its headers,
or announces a body and sends a few bytes of it, holds its connection (and a file
descriptor, and a parser) forever. Here every request's headers must arrive within
`header_seconds` of its first byte (of the connection's opening, for the first one) and its
body within `body_seconds` of its headers; otherwise the connection is closed and counted
(`recserve_http_timeouts_total{phase}`). A connection beyond `max_connections` open ones is
closed as soon as it is accepted (`recserve_http_connections_refused_total`): the kernel's
accept queue, not the server's memory, absorbs a flood.

Event-loop only, like uvicorn's protocol it extends.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

RECEIVED_KEY = "recserve.received"  # ASGI scope key: when the request's last byte arrived

__all__ = ["ConnectionLimits", "guarded_protocol"]


@dataclass(frozen=True)
class ConnectionLimits:
    header_seconds: float
    body_seconds: float
    max_connections: int


def guarded_protocol(limits: ConnectionLimits, timeouts: Counter, refused: Counter) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class bound to `limits` and the two counters."""
    header_timeouts, body_timeouts = timeouts.labels("header"), timeouts.labels("body")

    class GuardedHttpProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                refused.inc()
                transport.abort()
                return
            self._arm(limits.header_seconds, header_timeouts)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm(limits.header_seconds, header_timeouts)

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()
            if self.cycle is not None and self.cycle.more_body:
                self._arm(limits.body_seconds, body_timeouts)

        def on_message_complete(self) -> None:
            self._disarm()
            if self.cycle is not None:
                # Admission counts a request's wait from here (http_common.received_at).
                self.cycle.scope[RECEIVED_KEY] = time.monotonic()  # type: ignore[literal-required]
            super().on_message_complete()

        def _arm(self, seconds: float, counter: Any) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._expire, counter)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self, counter: Any) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                counter.inc()
                self.transport.abort()

    return GuardedHttpProtocol
