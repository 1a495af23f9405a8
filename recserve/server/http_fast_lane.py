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
from recserve.server.http_common import TIMEOUT_HEADER, deadline_from, dispatch_inline, error_response
from recserve.server.http_predict_routes import eas_response, match, predict_call, route_model
from recserve.server.registry import ModelEntry

__all__ = ["PENDING", "FastLane", "Pending"]

log = logging.getLogger("recserve.server")

_TIMEOUT = TIMEOUT_HEADER.encode()
_HEADER_LENGTH = kserve.HEADER_LENGTH.encode()
# Headers whose presence sends a request the ASGI way: a body that is not the plain bytes
# (compressed, chunked) or a client waiting for a 100 Continue.
_ELSEWHERE = frozenset((b"content-encoding", b"transfer-encoding", b"expect"))


class Pending:
    """The type of PENDING: an answer still to come."""


PENDING = Pending()

def _head_and_body(response: Response) -> tuple[bytes, bytes]:
    return b"".join(b"%s: %s\r\n" % pair for pair in response.raw_headers), response.body


_UNSEEN: object = object()
_MAX_PATHS = 1024  # distinct URLs remembered; beyond, the memory starts again

# Refusals have no trace: nothing of theirs ran (shared, never written to).
_NO_TRACE = RequestTrace()


class FastLane:
    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx
        self._refusals: dict[str, tuple[bytes, bytes]] = {}  # model -> its full-wait 503
        self._by_path: dict[bytes, tuple[str, ModelEntry] | None] = {}

    def _refusal(self, entry: ModelEntry, route: str, arrived: float, deadline: float | None) -> Response | None:
        """The 503 for a request that already waited past its model's max_queue_ms or its
        deadline on a busy loop, or whose model's wait is full, refused before anything else
        is done for it: under overload refusals are many, and each costs the requests that
        are admitted (one refused here costs a fraction of one refused on the ASGI route)."""
        try:
            entry.admission.check_wait(arrived, deadline)
            entry.admission.check_room()
        except OverloadedError as exc:
            self._ctx.metrics.observe(entry.name, route, exc.status, 0.0, RequestTrace())
            return error_response(exc.status, exc.message)
        return None

    def early_refusal(self, method: bytes, url: bytes, arrived: float) -> tuple[bytes, bytes] | None:
        """As a request's headers arrive (`url`: as sent; `arrived`: when its bytes were in
        the socket at the latest, time.monotonic() clock): when it is a prediction whose
        model's wait is full, or that already waited past its model's max_queue_ms on a busy
        loop, its 503's headers after the status line (no blank line) and body, else None.
        Refused before anything of it is built, its body read or decoded (a refusal cost
        ~100 us of CPU when it was read and parsed first). The full wait's bytes are built
        once per model (they always read the same: the count waiting is then the maximum),
        and a path's model is found once."""
        if method != b"POST":
            return None
        found = self._by_path.get(url, _UNSEEN)
        if found is _UNSEEN:
            found = self._find(url)
        if found is None:
            return None
        kind, entry = found
        admission = entry.admission
        if admission.waiting < admission.max_waiting:
            if time.monotonic() - arrived <= admission.max_queue_seconds:
                return None
            try:
                admission.check_wait(arrived)
            except OverloadedError as exc:
                self._ctx.metrics.observe(entry.name, kind, 503, 0.0, _NO_TRACE)
                return _head_and_body(error_response(exc.status, exc.message))
            return None
        self._ctx.metrics.observe(entry.name, kind, 503, 0.0, _NO_TRACE)
        refusal = self._refusals.get(entry.name)
        if refusal is None:
            try:
                admission.check_room()
            except OverloadedError as exc:
                refusal = self._refusals[entry.name] = _head_and_body(error_response(exc.status, exc.message))
            else:
                return None  # a place was given back meanwhile
        return refusal

    def _find(self, url: bytes) -> tuple[str, ModelEntry] | None:
        """The route kind and model of a prediction's URL, remembered (None: not a
        prediction, or not plainly one: a query or escapes go the general way)."""
        found = None
        if b"?" not in url and b"%" not in url:
            route = match(url.decode("latin-1"))
            if route is not None:
                kind, names = route
                entry = self._model(kind, names)
                found = None if entry is None else (kind, entry)
        if len(self._by_path) >= _MAX_PATHS:
            self._by_path.clear()
        self._by_path[url] = found
        return found

    def _model(self, kind: str, names: tuple[str, ...]) -> ModelEntry | None:
        models = self._ctx.models
        try:
            return models.get(route_model(kind, names)) if kind == "kserve" or len(names) > 1 else (
                models.for_service(names[0]))
        except RecserveError:
            return None

    def wants(self, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> bool:
        """Whether to hold the request's body for `answer` (headers: lower-case names)."""
        if method != "POST" or match(path) is None:
            return False
        length = None
        for name, value in headers:
            if name == b"content-length":
                length = value
            elif name in _ELSEWHERE:
                return False
        # The protocol stops reading past HIGH_WATER_LIMIT bytes of body until the app asks
        # for more: a body held here must fit below that.
        limit = min(self._ctx.inline.max_bytes, self._ctx.settings.max_request_bytes, HIGH_WATER_LIMIT)
        return length is not None and length.isdigit() and int(length) <= limit

    def gone(self, path: str) -> None:
        """The client of a request `wants` took went away before its body's end (routine for
        clients with timeouts of their own): counted, logged at DEBUG, as PredictRoutes does."""
        route = match(path)
        if route is not None:
            self._ctx.metrics.client_disconnects.labels(route[0]).inc()
        log.debug("POST %s: the client went away before the answer", path)

    def answer(self, path: str, headers: list[tuple[bytes, bytes]], body: bytes, arrived: float,
               reply: Callable[[Response], None]) -> Response | Pending | None:
        """The answer to a request `wants` took; PENDING when it waits to be merged with
        others (recserve.server.merging), and `reply` is called with its answer later, on the
        loop; None when it must take the ASGI route. `arrived`: when it was whole, at the
        latest (time.monotonic() clock)."""
        route = match(path)
        if route is None:
            return None
        kind, names = route
        ctx = self._ctx
        try:
            header_length = timeout = None
            for name, value in headers:
                if name == _HEADER_LENGTH:
                    header_length = value.decode("latin-1")
                elif name == _TIMEOUT:
                    timeout = value.decode("latin-1")
            deadline = deadline_from(timeout, arrived)
            entry = self._model(kind, names)  # None: unknown, the dispatcher answers it and counts it
            if entry is not None:
                refusal = self._refusal(entry, kind, arrived, deadline)
                if refusal is not None:
                    return refusal
                if kind == "eas" and body and ctx.merger.merges(entry):
                    ctx.merger.add(entry, body, arrived, deadline,
                                   lambda outcome, trace: reply(eas_response(outcome, trace)))
                    return PENDING
            call = predict_call(ctx, kind, names, body, header_length)
            if not ctx.inline.inline(call.model, len(body)):
                return None  # admitted so far: its turn comes on a worker thread, via ASGI
            return call.respond(dispatch_inline(ctx, call.route, call.model, call.find, call.handler,
                                                deadline, arrived))
        except RecserveError as exc:
            return error_response(exc.status, exc.message)
        except Exception as exc:  # a bug here must answer 500 and keep serving
            log.exception("POST %s failed", path)
            return error_response(500, f"internal error: {type(exc).__name__}: {exc}")
