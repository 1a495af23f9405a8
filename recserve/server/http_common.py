"""What the HTTP routes share: the JSON error body, bounded body reads, the hop to a worker
thread, admin auth."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable

from fastapi import Request
from fastapi.responses import JSONResponse

from recserve.errors import RecserveError, RequestError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.server.admission import AdmittedHandler, OverloadedError
from recserve.server.context import ServerContext
from recserve.server.dispatch import UNKNOWN_MODEL, Outcome
from recserve.server.errors import AdminAuthError, RequestTooLargeError
from recserve.server.registry import ModelEntry

__all__ = [
    "PROTOBUF",
    "RECEIVED_KEY",
    "TIMEOUT_HEADER",
    "Handler",
    "deadline_from",
    "dispatch",
    "dispatch_inline",
    "error_response",
    "read_body",
    "received_at",
    "request_body",
    "request_deadline",
    "require_admin",
    "served_headers",
]

PROTOBUF = "application/octet-stream"
TIMEOUT_HEADER = "x-request-timeout-ms"
RECEIVED_KEY = "recserve.received"  # ASGI scope key: when the request's last byte arrived (http_protocol)

Handler = Callable[[ModelEntry, Processor, RequestTrace], Outcome]


def error_response(status: int, message: str) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {"Retry-After": "1"} if status == 503 else None
    return JSONResponse({"error": message}, status_code=status, headers=headers)


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, refusing (413) one over `limit` bytes before reading it where the
    Content-Length says so, and as soon as it passes the limit otherwise."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > limit:
            raise RequestTooLargeError(f"request body of {declared} bytes exceeds max_request_bytes ({limit})")
        return await request.body()
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestTooLargeError(f"request body exceeds max_request_bytes ({limit})")
        chunks.append(chunk)
    return b"".join(chunks)


def require_admin(ctx: ServerContext, request: Request) -> None:
    if not ctx.settings.admin_allowed(request.headers.get("authorization")):
        raise AdminAuthError(
            "admin routes need 'Authorization: Bearer <token>' with the server's admin token "
            "(config admin_token or RECSERVE_ADMIN_TOKEN)")


def _decompressed(request: Request, body: bytes) -> bytes:
    encoding = request.headers.get("content-encoding", "identity").lower()
    if encoding in ("identity", ""):
        return body
    if encoding not in ("gzip", "deflate"):
        raise RequestError(f"Content-Encoding {encoding!r} is not supported; use gzip, deflate or none")
    try:
        return zlib.decompress(body, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
    except zlib.error as exc:
        raise RequestError(f"request body is not valid {encoding} data: {exc}") from exc


async def request_body(
    ctx: ServerContext, request: Request, route: str, model: str, *, decompress: bool = False
) -> bytes:
    """The body (decompressed per Content-Encoding with `decompress`); a refusal before any
    model is reached (too large, bad encoding) is counted like every other answer."""
    try:
        body = await read_body(request, ctx.settings.max_request_bytes)
        return _decompressed(request, body) if decompress else body
    except RecserveError as exc:
        label = model if model in ctx.models.entries else UNKNOWN_MODEL
        ctx.metrics.observe(label, route, exc.status, 0.0, RequestTrace())
        raise


async def dispatch(
    ctx: ServerContext, route: str, model: str, body_bytes: int, find: Callable[[], ModelEntry], handler: Handler,
    deadline: float | None = None, arrived: float | None = None,
) -> Outcome:
    """`handler` through the dispatcher, on the loop or a worker thread as `ctx.inline`
    decides for `model` (the name the URL gives), after its turn in the model's admission
    (`deadline`: the client's; `arrived`: when the request's headers were read; both on the
    time.monotonic() clock); (status, result or message)."""
    if ctx.inline.inline(model, body_bytes):
        return dispatch_inline(ctx, route, model, find, handler, deadline, arrived)
    admitted = _admit(ctx, route, find, handler, deadline, arrived)
    if isinstance(admitted, tuple):
        return admitted
    try:
        # asyncio's executor hop costs less CPU per request than anyio's to_thread.
        outcome, seconds, released = await asyncio.get_running_loop().run_in_executor(
            ctx.workers, _timed_call, ctx, route, find, admitted, time.thread_time)
    finally:
        admitted.settle()
    ctx.inline.record(model, seconds, released)
    return outcome


def dispatch_inline(
    ctx: ServerContext, route: str, model: str, find: Callable[[], ModelEntry], handler: Handler,
    deadline: float | None = None, arrived: float | None = None,
) -> Outcome:
    """`dispatch` on the calling thread (the event loop's, for a model `ctx.inline` keeps there)."""
    admitted = _admit(ctx, route, find, handler, deadline, arrived)
    if isinstance(admitted, tuple):
        return admitted
    try:
        outcome, seconds, released = _timed_call(ctx, route, find, admitted)
    finally:
        admitted.settle()
    ctx.inline.record(model, seconds, released)
    return outcome


def _admit(ctx: ServerContext, route: str, find: Callable[[], ModelEntry], handler: Handler,
           deadline: float | None, arrived: float | None) -> AdmittedHandler | Outcome:
    """`handler` holding a place in its model's admission; the refusal's outcome when the
    wait is full. A model that cannot be found gets a handler that the dispatcher never runs
    (it answers the error, and counts it)."""
    try:
        entry = find()
    except RecserveError:
        return AdmittedHandler(handler, None, 0.0, deadline)
    try:
        arrived = entry.admission.arrive(arrived)
    except OverloadedError as exc:
        ctx.metrics.observe(entry.name, route, exc.status, 0.0, RequestTrace())
        return exc.status, exc.message
    return AdmittedHandler(handler, entry.admission, arrived, deadline)


def served_headers(served: list[RequestTrace]) -> dict[str, str]:
    """The answering version's headers (X-Recserve-Model-Version, X-Recserve-Delta-Step)
    from the trace a handler kept; none when the handler never ran."""
    return dict(served[0].served_by()) if served and served[0].model_version else {}


def received_at(request: Request) -> float:
    """When the request was whole (time.monotonic() clock): stamped by the HTTP protocol
    (recserve.server.http_protocol) as its last byte arrived, so time the request then spent
    behind others on the event loop counts as waiting; now, when no stamp is there."""
    stamp = request.scope.get(RECEIVED_KEY)
    return time.monotonic() if stamp is None else float(stamp)


def request_deadline(request: Request, arrived: float) -> float | None:
    """The client's deadline from `X-Request-Timeout-Ms`, counted from `arrived`
    (time.monotonic() clock), if sent."""
    return deadline_from(request.headers.get(TIMEOUT_HEADER), arrived)


def deadline_from(raw: str | None, arrived: float) -> float | None:
    """The deadline an `X-Request-Timeout-Ms` value (None: not sent) sets, counted from `arrived`."""
    if raw is None:
        return None
    try:
        ms = float(raw)
    except ValueError:
        ms = -1.0
    if not 0 <= ms < float("inf"):
        raise RequestError(f"X-Request-Timeout-Ms must be a number of milliseconds >= 0, got {raw!r}")
    return arrived + ms / 1000


def _timed_call(ctx: ServerContext, route: str, find: Callable[[], ModelEntry], handler: Handler,
                clock: Callable[[], float] = time.perf_counter) -> tuple[Outcome, float, float]:
    """The outcome, the prediction's own time and the part of it run with the GIL released."""
    # The prediction's own time: time spent queued for a worker must not make a model look
    # slow. On a worker thread the clock is the thread's CPU time: the wall time also counts
    # the waits for the GIL that the other workers hold (many ms under load), which would
    # keep a short model off the loop for good.
    trace = RequestTrace()
    started = clock()
    outcome = ctx.dispatcher.call(route, find, handler, trace)
    return outcome, clock() - started, trace.released_ns / 1e9
