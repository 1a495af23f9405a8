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

A request the FastLane wants (recserve.server.http_fast_lane) gets no ASGI task when its
headers arrive: its body gathers here and the fast lane answers it as the last byte arrives,
the answer written straight to the transport (or, when the fast lane declines, the task
starts then, and the app reads the body already gathered).

Shutdown (`shutdown()`, which uvicorn calls on every connection once the listener is
closed): a request in flight is answered with `Connection: close`, as uvicorn does; an idle
keep-alive connection is not closed at once, as uvicorn would (a request its client sends
at that moment would be lost unanswered), but stays open until it has been idle for
`DRAIN_IDLE_SECONDS`, and a request arriving meanwhile is answered with `Connection: close`.

Event-loop only, like uvicorn's protocol it extends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol, RequestResponseCycle

from recserve.server.http_common import RECEIVED_KEY
from recserve.server.http_fast_lane import FastLane

__all__ = ["DRAIN_IDLE_SECONDS", "ConnectionLimits", "guarded_protocol"]

# How long an idle connection stays open once shutdown began: longer than a client's gap
# between a response and its next request on the connection, or between connecting and
# sending (a connection accepted from the queue at shutdown), short enough not to hold
# the exit.
DRAIN_IDLE_SECONDS = 1.0


class IoBatchClock:
    """When the event loop began its current batch of I/O callbacks: data handled in that
    batch was already in its socket then. Requests behind many others on a busy loop wait
    in socket buffers, where no queue sees them; stamping a request with its batch's start
    (a lower bound of its arrival) lets admission count that wait (max_queue_ms) and turn
    the excess away cheaply instead of running it late. The batch ends at the loop's next
    ready-callback phase (call_soon), once per loop iteration, not per request."""

    __slots__ = ("_start",)

    def __init__(self) -> None:
        self._start: float | None = None

    def mark(self, loop: asyncio.AbstractEventLoop) -> float:
        start = self._start
        if start is None:
            start = self._start = time.monotonic()
            loop.call_soon(self._end)
        return start

    def _end(self) -> None:
        self._start = None


@dataclass(frozen=True)
class ConnectionLimits:
    header_seconds: float
    body_seconds: float
    max_connections: int


def guarded_protocol(limits: ConnectionLimits, timeouts: Counter, refused: Counter,
                     fast_lane: FastLane | None = None,
                     draining: Callable[[], bool] = lambda: False) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class bound to `limits`, the two counters and `fast_lane`;
    `draining()` true once shutdown began (from the signal on, before uvicorn's shutdown
    reaches the connections): every request then is answered with `Connection: close`."""
    header_timeouts, body_timeouts = timeouts.labels("header"), timeouts.labels("body")
    clock = IoBatchClock()

    class GuardedHttpProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None
        _in_headers = False
        _held: RequestResponseCycle | None = None  # a request the fast lane took, body gathering
        _batch = 0.0  # IoBatchClock.mark() of the read being parsed
        _in_message = False  # a request's first byte arrived, its last not yet
        _draining = False
        _drain_timer: asyncio.TimerHandle | None = None

        def data_received(self, data: bytes) -> None:
            self._batch = clock.mark(self.loop)
            super().data_received(data)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                refused.inc()
                transport.abort()
                return
            self._arm(limits.header_seconds, header_timeouts)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._drain_timer is not None:
                self._drain_timer.cancel()
            if self._held is not None and fast_lane is not None:
                fast_lane.gone(self._held.scope["path"])
            self._held = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            # A request pipelined behind one the fast lane answered within the same read:
            # the keep-alive timer that answer armed must not run during this one.
            self._unset_keepalive_if_required()
            self._in_message = True
            if self._drain_timer is not None:
                self._drain_timer.cancel()
                self._drain_timer = None
            super().on_message_begin()
            self._arm(limits.header_seconds, header_timeouts)

        def on_headers_complete(self) -> None:
            self._disarm()
            self._in_headers = True
            try:
                super().on_headers_complete()
            finally:
                self._in_headers = False
            if self.cycle is not None and (self._draining or draining()):
                self.cycle.keep_alive = False  # answered with `Connection: close`
            if self.cycle is not None and self.cycle.more_body:
                self._arm(limits.body_seconds, body_timeouts)

        def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
            if (fast_lane is not None and self._in_headers and app is self.app
                    and fast_lane.wants(cycle.scope["method"], cycle.scope["path"], self.headers)):
                self._held = cycle
                return
            super()._start_asgi_task(cycle, app)

        def on_message_complete(self) -> None:
            self._disarm()
            self._in_message = False
            if self.cycle is not None:
                # Admission counts a request's wait from here (http_common.received_at).
                self.cycle.scope[RECEIVED_KEY] = self._batch  # type: ignore[literal-required]
            super().on_message_complete()
            cycle, self._held = self._held, None
            if cycle is not None and cycle is self.cycle and fast_lane is not None:
                self._answer_fast(cycle, fast_lane)

        def _answer_fast(self, cycle: RequestResponseCycle, lane: FastLane) -> None:
            response = lane.answer(cycle.scope["path"], self.headers, cycle.body, self._batch)
            if response is None:
                super()._start_asgi_task(cycle, self.app)
                return
            content = [STATUS_LINE[response.status_code]]
            for name, value in (*self.server_state.default_headers, *response.raw_headers):
                content.extend((name, b": ", value, b"\r\n"))
            if not cycle.keep_alive:
                content.append(b"connection: close\r\n")
            content.extend((b"\r\n", response.body))
            self.transport.write(b"".join(content))
            cycle.response_started = cycle.response_complete = True
            if cycle.keep_alive:
                self.on_response_complete()
            else:
                self.transport.close()

        def shutdown(self) -> None:
            self._draining = True
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.keep_alive = False
            elif not self._in_message and self._drain_timer is None:
                self._drain_timer = self.loop.call_later(DRAIN_IDLE_SECONDS, self._close_if_idle)

        def _close_if_idle(self) -> None:
            self._drain_timer = None
            if not self._in_message and (self.cycle is None or self.cycle.response_complete):
                self.transport.close()

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
