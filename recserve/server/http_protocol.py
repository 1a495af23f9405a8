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
the answer written to the transport when the loop's pass over the ready connections ends
(recserve.server.write_coalescer), or, when the fast lane declines, the task starts then,
and the app reads the body already gathered.

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

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from recserve.server.http_common import RECEIVED_KEY
from recserve.server.http_fast_lane import Answer, FastLane, FastRoute, Pending
from recserve.server.write_coalescer import WriteCoalescer

__all__ = ["DRAIN_IDLE_SECONDS", "ConnectionLimits", "guarded_protocol"]

# How long an idle connection stays open once shutdown began: longer than a client's gap
# between a response and its next request on the connection, or between connecting and
# sending (a connection accepted from the queue at shutdown), short enough not to hold
# the exit.
DRAIN_IDLE_SECONDS = 1.0

_KEEP_ALIVE = object()  # the phase between a fast-lane answer and the next request


class _NoWaiter:
    """The message event of a _FastCycle: nothing waits on it (uvicorn sets it when the
    connection is lost)."""

    __slots__ = ()

    def set(self) -> None:
        pass


_NO_WAITER = _NoWaiter()


class _FastCycle:
    """The connection's current request while the fast lane holds it: what uvicorn reads of
    its RequestResponseCycle (pipelining waits behind it, shutdown and connection loss mark
    it), without the ASGI scope, the Event and the dozen fields a cycle builds."""

    __slots__ = ("body", "disconnected", "headers_batch", "keep_alive", "response_complete", "response_started")
    message_event = _NO_WAITER

    def __init__(self, keep_alive: bool, headers_batch: float) -> None:
        self.body = b""
        self.keep_alive = keep_alive
        self.headers_batch = headers_batch  # IoBatchClock.mark() of the read that ended its headers
        self.response_started = self.response_complete = self.disconnected = False


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


def guarded_protocol(limits: ConnectionLimits, timeouts: Any, refused: Any,
                     fast_lane: FastLane | None = None,
                     draining: Callable[[], bool] = lambda: False) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class bound to `limits`, the two counters and `fast_lane`;
    `draining()` true once shutdown began (from the signal on, before uvicorn's shutdown
    reaches the connections): every request then is answered with `Connection: close`."""
    header_timeouts, body_timeouts = timeouts.labels("header"), timeouts.labels("body")
    clock = IoBatchClock()
    writes = WriteCoalescer()
    # uvicorn's default headers (date, server) as bytes, made again when uvicorn replaces
    # the list (each second, for the date).
    defaults: list[Any] = [None, b""]

    def default_head(headers: list[tuple[bytes, bytes]]) -> bytes:
        if headers is not defaults[0]:
            defaults[:] = [headers, b"".join(b"%s: %s\r\n" % pair for pair in headers)]
        return defaults[1]  # type: ignore[no-any-return]

    class GuardedHttpProtocol(HttpToolsProtocol):
        # The phase the connection is in and when it ends (loop.time() clock): its headers,
        # its body, its discarded input (None: counted nowhere) or, after a fast-lane answer,
        # the keep-alive wait (_KEEP_ALIVE). One timer per connection watches it (see _arm).
        _deadline_at: float | None = None
        _deadline_counter: Any = None
        _watch: asyncio.TimerHandle | None = None
        _watch_at = 0.0
        _held: _FastCycle | None = None  # a request the fast lane took, body gathering
        _held_route: FastRoute | None = None
        _batch = 0.0  # IoBatchClock.mark() of the read being parsed
        _skipping = False  # a refused request's body is passing: dropped (see _refuse)
        _discarding = False  # a refusal was answered and the connection half-closed: all input dropped
        _in_message = False  # a request's first byte arrived, its last not yet
        _draining = False
        _drain_timer: asyncio.TimerHandle | None = None

        def data_received(self, data: bytes) -> None:
            if self._discarding:
                return  # the rest of a refused request's body (see _refuse)
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
            self._deadline_at = None
            if self._watch is not None:
                self._watch.cancel()
                self._watch = None
            if self._drain_timer is not None:
                self._drain_timer.cancel()
            if self._held_route is not None and fast_lane is not None:
                fast_lane.gone(self._held_route)
            self._held = self._held_route = None
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            if self._discarding:
                return  # parsed in the same read as a refused request (see _refuse): dropped
            # A request pipelined behind one the fast lane answered within the same read:
            # the keep-alive timer that answer armed must not run during this one.
            self._unset_keepalive_if_required()
            self._in_message = True
            if self._drain_timer is not None:
                self._drain_timer.cancel()
                self._drain_timer = None
            # uvicorn's on_message_begin, but its ASGI scope is built only for a request the
            # fast lane does not take (_build_scope).
            self.url = b""
            self.expect_100_continue = False
            self.headers = []
            self._arm(limits.header_seconds, header_timeouts)

        def _build_scope(self) -> None:
            """uvicorn's scope for the request whose URL and headers were read."""
            url, headers, expect = self.url, self.headers, self.expect_100_continue
            super().on_message_begin()  # resets all three
            self.url, self.headers, self.expect_100_continue = url, headers, expect
            self.scope["headers"] = headers

        def on_headers_complete(self) -> None:
            if self._discarding:
                return
            self._deadline_at = None
            if fast_lane is not None and (self.cycle is None or self.cycle.response_complete):
                parser = self.parser
                route = fast_lane.route(parser.get_method(), self.url)
                if route is not None:
                    refusal = fast_lane.early_refusal(route, self._batch)
                    if refusal is not None:
                        self._refuse(refusal)
                        return
                    if fast_lane.wants(self.headers):
                        keep = parser.get_http_version() != "1.0" and parser.should_keep_alive()
                        self.cycle = self._held = _FastCycle(  # type: ignore[assignment]
                            keep and not (self._draining or draining()), self._batch)
                        self._held_route = route
                        self._arm(limits.body_seconds, body_timeouts)
                        return
            self._build_scope()
            super().on_headers_complete()
            if self.cycle is not None and (self._draining or draining()):
                self.cycle.keep_alive = False  # answered with `Connection: close`
            if self.cycle is not None and self.cycle.more_body:
                self._arm(limits.body_seconds, body_timeouts)

        def _to_asgi(self, held: _FastCycle) -> None:
            """The ASGI task for a request the fast lane held to its end and then declined:
            the scope and cycle uvicorn would have built at its headers, its body whole."""
            self._build_scope()
            self.cycle = None  # type: ignore[assignment]  # so uvicorn starts the task, not a pipeline
            super().on_headers_complete()
            cycle = self.cycle
            cycle.body = bytearray(held.body)
            cycle.more_body = False
            cycle.keep_alive = held.keep_alive
            cycle.scope[RECEIVED_KEY] = self._batch  # type: ignore[literal-required]
            cycle.message_event.set()

        def _refuse(self, refusal: Answer) -> None:
            """Answer 503 as the headers arrive, before anything of the request is built
            (no ASGI scope, no cycle): its body is then skipped as the parser passes it, and
            the connection serves the next request. Measured per refusal of the demo model
            (every request refused, wrk -c64): 38-44 us of server CPU this way, 159-182 us
            answering `Connection: close` and closing (each refusal then costs a new
            connection on both sides), so only a client that will not keep the connection
            (HTTP/1.0, its own Connection: close) is closed: half-closed, so it reads the
            answer to its end (closing outright with its body unread in our socket would
            send a reset, which may destroy the answer in its buffer before it is read), and
            what it still sends is dropped unparsed."""
            status, head, body = refusal
            keep = self.parser.should_keep_alive() and not (self._draining or draining())
            answer = b"".join((STATUS_LINE[status], default_head(self.server_state.default_headers), head,
                               b"\r\n" if keep else b"connection: close\r\n\r\n", body))
            if keep:
                writes.write(self.loop, self.transport, answer)
            else:  # its end of the connection follows at once: the answers before it first
                writes.flush()
                self.transport.write(answer)
            self.server_state.total_requests += 1
            if keep:
                self._skipping = True
                self._arm(limits.body_seconds, body_timeouts)
            elif self.transport.can_write_eof():
                self._discarding = True
                self.transport.write_eof()
                self._arm(limits.body_seconds, None)
            else:
                self.transport.close()

        def on_body(self, body: bytes) -> None:
            if self._skipping:
                return
            held = self._held
            if held is not None and held is self.cycle:
                held.body += body  # the first part is kept as it is: usually the whole body
                return
            super().on_body(body)

        def on_message_complete(self) -> None:
            if self._discarding:
                return
            self._deadline_at = None
            self._in_message = False
            if self._skipping:  # a refused request's body has passed: the connection waits for the next
                self._skipping = False
                self._arm(self.timeout_keep_alive, _KEEP_ALIVE)
                return
            held, route = self._held, self._held_route
            self._held = self._held_route = None
            if held is not None and held is self.cycle and route is not None and fast_lane is not None:
                self._answer_fast(held, route, fast_lane)
                return
            if self.cycle is not None:
                # Admission counts a request's wait from here (http_common.received_at).
                self.cycle.scope[RECEIVED_KEY] = self._batch  # type: ignore[literal-required]
            super().on_message_complete()

        def _answer_fast(self, held: _FastCycle, route: FastRoute, lane: FastLane) -> None:
            answer = lane.answer(route, self.headers, held.body, self._batch,
                                 lambda later: self._write_fast(held, route, later),
                                 admitted_at_headers=held.headers_batch == self._batch)
            if answer is None:
                self._to_asgi(held)
            elif not isinstance(answer, Pending):
                self._write_fast(held, route, answer)

        def _write_fast(self, cycle: _FastCycle, route: FastRoute, answer: Answer) -> None:
            if self.transport.is_closing():  # the client went away while its request waited
                if fast_lane is not None:
                    fast_lane.gone(route)
                return
            status, head, body = answer
            data = b"".join((STATUS_LINE[status], default_head(self.server_state.default_headers), head,
                             b"\r\n" if cycle.keep_alive else b"connection: close\r\n\r\n", body))
            cycle.response_started = cycle.response_complete = True
            if not cycle.keep_alive:
                writes.flush()  # the answers before it first: the connection closes after this one
                self.transport.write(data)
                self.transport.close()
                return
            writes.write(self.loop, self.transport, data)
            # uvicorn's on_response_complete, with the keep-alive wait watched by the
            # connection's one timer instead of a timer per answer.
            self.server_state.total_requests += 1
            self._unset_keepalive_if_required()
            self.flow.resume_reading()
            if self.pipeline:
                cycle, app = self.pipeline.pop()
                self._start_asgi_task(cycle, app)
            else:
                self._arm(self.timeout_keep_alive, _KEEP_ALIVE)

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
            """The connection's phase ends in `seconds`; then it is closed (`_expire`). Phases
            change several times per request: rather than a timer each, the connection's one
            timer fires at the earliest deadline it was set for and, finding a later
            deadline there, sets itself again (at most once per phase length per
            connection)."""
            at = self.loop.time() + seconds
            self._deadline_at = at
            self._deadline_counter = counter
            if self._watch is None or at < self._watch_at:
                if self._watch is not None:
                    self._watch.cancel()
                self._watch_at = at
                self._watch = self.loop.call_at(at, self._check_deadline)

        def _check_deadline(self) -> None:
            self._watch = None
            at = self._deadline_at
            if at is None:
                return  # no phase is timed now (a request is being answered); the next _arm sets the timer
            if self.loop.time() < at:
                self._watch_at = at
                self._watch = self.loop.call_at(at, self._check_deadline)
                return
            self._deadline_at = None
            self._expire(self._deadline_counter)

        def _expire(self, counter: Any) -> None:
            if counter is _KEEP_ALIVE:
                self.timeout_keep_alive_handler()
                return
            if not self.transport.is_closing() or self._discarding:
                if counter is not None:
                    counter.inc()
                self.transport.abort()

    return GuardedHttpProtocol
