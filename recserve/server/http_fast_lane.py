"""Short predictions answered inside the HTTP protocol, without an ASGI task.

uvicorn runs every request as a new task through the ASGI app: the task, the receive and
send coroutines, Starlette's Request and Response and the header lists cost more CPU than a
batch-1 prediction itself. A prediction that the InlinePolicy keeps on the event loop
anyway gains nothing from them. So when a request's headers arrive, the HTTP protocol
(recserve.server.http_protocol) asks `FastLane.wants`: a POST on a prediction route
(PredictRoutes') with a Content-Length that fits one read and no Content-Encoding,
Transfer-Encoding or Expect. Its body then gathers in the protocol, and as its last byte
arrives `FastLane.answer` refuses it (503) when its model's wait is full or it waited too
long, runs it with the same call (predict_call), admission, dispatcher, metrics and answer
as PredictRoutes, or declines (None) when its model runs on worker threads, and the request
takes the ASGI route unchanged.

Per request, nothing is looked up twice: a URL's route and model are found once
(`FastLane.route`, remembered per URL), and an EAS answer's head is written as bytes, not
through Starlette's Response (the whole protocol's CPU around the handler, batch 1:
see BENCHMARKS.md, bench_merging).

Event loop only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from starlette.responses import Response
from uvicorn.protocols.http.httptools_impl import HIGH_WATER_LIMIT

from recserve.errors import RecserveError
from recserve.processor.trace import RequestTrace
from recserve.server import kserve
from recserve.server.admission import OverloadedError
from recserve.server.context import ServerContext
from recserve.server.dispatch import Outcome
from recserve.server.http_common import TIMEOUT_HEADER, Handler, deadline_from, error_response
from recserve.server.http_predict_routes import eas_handler, match, predict_call, route_model
from recserve.server.registry import ModelEntry

__all__ = ["PENDING", "Answer", "FastLane", "FastRoute", "Pending"]

log = logging.getLogger("recserve.server")

_TIMEOUT = TIMEOUT_HEADER.encode()
_HEADER_LENGTH = kserve.HEADER_LENGTH.encode()
# Headers whose presence sends a request the ASGI way: a body that is not the plain bytes
# (compressed, chunked), a client waiting for a 100 Continue, or one asking to upgrade.
_ELSEWHERE = frozenset((b"content-encoding", b"transfer-encoding", b"expect", b"upgrade"))


class Pending:
    """The type of PENDING: an answer still to come."""


PENDING = Pending()

# An answer as the protocol writes it: status, its header lines after the status line
# (each ending in CRLF, no blank line), body.
Answer = tuple[int, bytes, bytes]


def _answer_of(response: Response) -> Answer:
    return response.status_code, b"".join(b"%s: %s\r\n" % pair for pair in response.raw_headers), response.body


def _served_answer(outcome: Outcome, trace: RequestTrace | None, content_type: bytes) -> Answer:
    """A prediction's answer: its bytes with the answering version's headers, in the order
    Starlette's Response would write them (http_common.served_headers, then length and
    type); or the JSON error."""
    status, result = outcome
    if status != 200:
        return _answer_of(error_response(status, result))
    if trace is not None and trace.model_version:
        head = b"x-recserve-model-version: %s\r\nx-recserve-delta-step: %d\r\ncontent-length: %d\r\n" % (
            trace.model_version.encode("latin-1"), trace.delta_step, len(result))
    else:
        head = b"content-length: %d\r\n" % len(result)
    return 200, head + content_type, result


_JSON = b"content-type: application/json\r\n"


def eas_answer(outcome: Outcome, trace: RequestTrace | None) -> Answer:
    """An EAS prediction's answer (non-empty request): PredictResponse bytes, or the JSON error."""
    return _served_answer(outcome, trace, b"content-type: application/octet-stream\r\n")


_UNSEEN: object = object()
_MAX_PATHS = 1024  # distinct URLs remembered; beyond, the memory starts again

# Refusals have no trace: nothing of theirs ran (shared, never written to).
_NO_TRACE = RequestTrace()


class FastRoute:
    """What a prediction URL names: its route kind ("eas", "kserve"), the names in its path,
    its model, and the key the InlinePolicy and the route's metrics know it by."""

    __slots__ = ("entry", "find", "kind", "model", "names", "path")

    def __init__(self, path: str, kind: str, names: tuple[str, ...], entry: ModelEntry) -> None:
        self.path = path
        self.kind = kind
        self.names = names
        self.entry = entry
        self.model = route_model(kind, names)
        self.find: Callable[[], ModelEntry] = lambda: entry  # registry entries never change


class FastLane:
    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx
        self._refusals: dict[str, Answer] = {}  # model -> its full-wait 503
        self._by_path: dict[bytes, FastRoute | None] = {}
        # The protocol stops reading past HIGH_WATER_LIMIT bytes of body until the app asks
        # for more: a body held here must fit below that.
        self._max_body = min(ctx.inline.max_bytes, ctx.settings.max_request_bytes, HIGH_WATER_LIMIT)

    def route(self, method: bytes, url: bytes) -> FastRoute | None:
        """The prediction a request's method and URL (as sent) ask for, or None: not a
        prediction, not plainly one (a query or escapes), or of no configured model: those
        take the ASGI route. Found once per URL."""
        if method != b"POST":
            return None
        found = self._by_path.get(url, _UNSEEN)
        if found is _UNSEEN:
            found = self._find(url)
        return found  # type: ignore[return-value]

    def _find(self, url: bytes) -> FastRoute | None:
        found = None
        if b"?" not in url and b"%" not in url:
            path = url.decode("latin-1")
            route = match(path)
            if route is not None:
                kind, names = route
                entry = self._model(kind, names)
                found = None if entry is None else FastRoute(path, kind, names, entry)
        if len(self._by_path) >= _MAX_PATHS:
            self._by_path.clear()
        self._by_path[url] = found
        return found

    def _model(self, kind: str, names: tuple[str, ...]) -> ModelEntry | None:
        models = self._ctx.models
        try:
            return models.get(route_model(kind, names)) if kind != "eas" or len(names) > 1 else (
                models.for_service(names[0]))
        except RecserveError:
            return None

    def _refusal(self, route: FastRoute, arrived: float, deadline: float | None) -> Answer | None:
        """The 503 for a request that already waited past its model's max_queue_ms or its
        deadline on a busy loop, or whose model's wait is full, refused before anything else
        is done for it: under overload refusals are many, and each costs the requests that
        are admitted (one refused here costs a fraction of one refused on the ASGI route)."""
        entry = route.entry
        try:
            entry.admission.check_wait(arrived, deadline)
            entry.admission.check_room()
        except OverloadedError as exc:
            self._ctx.metrics.observe(entry.name, route.kind, exc.status, 0.0, _NO_TRACE)
            return _answer_of(error_response(exc.status, exc.message))
        return None

    def early_refusal(self, route: FastRoute, arrived: float) -> Answer | None:
        """As a prediction's headers arrive (`arrived`: when its bytes were in the socket at
        the latest, time.monotonic() clock): its 503 when its model's wait is full, or when
        it already waited past its model's max_queue_ms on a busy loop, else None. Refused
        before anything of it is built, its body read or decoded (a refusal cost ~100 us of
        CPU when it was read and parsed first). The full wait's bytes are built once per
        model (they always read the same: the count waiting is then the maximum)."""
        entry = route.entry
        admission = entry.admission
        if admission.waiting < admission.max_waiting:
            if time.monotonic() - arrived <= admission.max_queue_seconds:
                return None
            try:
                admission.check_wait(arrived)
            except OverloadedError as exc:
                self._ctx.metrics.observe(entry.name, route.kind, 503, 0.0, _NO_TRACE)
                return _answer_of(error_response(exc.status, exc.message))
            return None
        self._ctx.metrics.observe(entry.name, route.kind, 503, 0.0, _NO_TRACE)
        refusal = self._refusals.get(entry.name)
        if refusal is None:
            try:
                admission.check_room()
            except OverloadedError as exc:
                refusal = self._refusals[entry.name] = _answer_of(error_response(exc.status, exc.message))
            else:
                return None  # a place was given back meanwhile
        return refusal

    def wants(self, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether to hold a prediction's body for `answer` (headers: lower-case names)."""
        length = None
        for name, value in headers:
            if name == b"content-length":
                length = value
            elif name in _ELSEWHERE:
                return False
        return length is not None and length.isdigit() and int(length) <= self._max_body

    def gone(self, route: FastRoute) -> None:
        """The client of a request `wants` took went away before its answer (routine for
        clients with timeouts of their own): counted, logged at DEBUG, as PredictRoutes does."""
        self._ctx.metrics.client_disconnects.labels(route.kind).inc()
        log.debug("POST %s: the client went away before the answer", route.path)

    def _run_inline(self, route: FastRoute, handler: Handler) -> Outcome:
        """`handler` through the dispatcher on the loop, now: `_refusal` has just checked
        the model's wait and the request's deadline, and it starts at once, so it takes no
        place in the wait (http_common.dispatch_inline's admission, without the steps)."""
        trace = RequestTrace()
        started = time.perf_counter()
        outcome = self._ctx.dispatcher.call(route.kind, route.find, handler, trace)
        self._ctx.inline.record(route.model, time.perf_counter() - started, trace.released_ns / 1e9)
        return outcome

    def answer(self, route: FastRoute, headers: list[tuple[bytes, bytes]], body: bytes, arrived: float,
               reply: Callable[[Answer], None], *, admitted_at_headers: bool = False) -> Answer | Pending | None:
        """The answer to a request `wants` took; PENDING when it waits to be merged with
        others (recserve.server.merging), and `reply` is called with its answer later, on the
        loop; None when it must take the ASGI route. `arrived`: when it was whole, at the
        latest (time.monotonic() clock). `admitted_at_headers`: its whole body came in the
        same pass of the loop as its headers, which `early_refusal` let through then (with
        the same `arrived`): only a deadline is left to check."""
        ctx = self._ctx
        kind = route.kind
        try:
            header_length = timeout = None
            for name, value in headers:
                if name == _HEADER_LENGTH:
                    header_length = value.decode("latin-1")
                elif name == _TIMEOUT:
                    timeout = value.decode("latin-1")
            deadline = deadline_from(timeout, arrived) if timeout is not None else None
            if deadline is not None or not admitted_at_headers:
                refusal = self._refusal(route, arrived, deadline)
                if refusal is not None:
                    return refusal
            if kind == "eas" and body:
                entry = route.entry
                if ctx.merger.merges(entry):
                    ctx.merger.add(entry, body, arrived, deadline,
                                   lambda outcome, trace: reply(eas_answer(outcome, trace)))
                    return PENDING
                if not ctx.inline.inline(route.model, len(body)):
                    return None  # admitted so far: its turn comes on a worker thread, via ASGI
                served: list[RequestTrace] = []
                outcome = self._run_inline(route, eas_handler(body, served))
                return eas_answer(outcome, served[0] if served else None)
            call = predict_call(ctx, kind, route.names, body, header_length)
            if not ctx.inline.inline(call.model, len(body)):
                return None
            status, result = outcome = self._run_inline(route, call.handler)
            trace = call.served[0] if call.served else None
            if status == 200 and kind == "tfserving":
                return _served_answer(outcome, trace, _JSON)
            if status == 200 and kind == "kserve" and result[1] is None:  # a JSON answer (no binary part)
                return _served_answer((200, result[0]), trace, _JSON)
            return _answer_of(call.respond(outcome))
        except RecserveError as exc:
            return _answer_of(error_response(exc.status, exc.message))
        except Exception as exc:  # a bug here must answer 500 and keep serving
            log.exception("POST %s failed", route.path)
            return _answer_of(error_response(500, f"internal error: {type(exc).__name__}: {exc}"))
