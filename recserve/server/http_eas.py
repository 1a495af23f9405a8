"""The EAS/DeepRec protobuf route, `POST /api/predict/{service}[/{model}]`, as plain ASGI in
front of the FastAPI app: PredictRequest bytes in, `Processor.process`, PredictResponse
bytes out (an empty body asks for the signature, as JSON).

It is the route RPC-style clients call at high rates, and FastAPI's routing and dependency
solving cost more CPU than the prediction itself: server CPU per batch-1 request of the demo
model measured ~800 us through FastAPI, ~300 us here (uvicorn alone: ~110 us). Every other
request goes to the FastAPI app; answers keep its shapes (JSON errors, 405 with Allow).
"""

from __future__ import annotations

import logging

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from recserve.errors import RecserveError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.server.context import ServerContext
from recserve.server.dispatch import Outcome
from recserve.server.http_common import PROTOBUF, Handler, dispatch, error_response, request_body
from recserve.server.registry import ModelEntry

__all__ = ["EasPredictRoute"]

log = logging.getLogger("recserve.server")

PREFIX = "/api/predict/"


def _handler(body: bytes) -> Handler:
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        status, result = processor.process(body, trace=trace)
        if status == 200 and body:  # an empty body asked for the signature
            entry.record(body)
        return status, result
    return handle


class EasPredictRoute:
    """ASGI: the EAS route itself, everything else to `app`. Stateless; serves any number
    of concurrent requests."""

    def __init__(self, app: ASGIApp, ctx: ServerContext) -> None:
        self._app = app
        self._ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        # One trailing slash is the same route (FastAPI would have redirected to it).
        names = path[len(PREFIX):].removesuffix("/").split("/") if path.startswith(PREFIX) else []
        if not 1 <= len(names) <= 2 or not all(names):
            await self._app(scope, receive, send)  # another route, or a 404 of FastAPI's
            return
        if scope["method"] != "POST":
            response: Response = error_response(405, "Method Not Allowed")
            response.headers["Allow"] = "POST"
        else:
            try:
                response = await self._predict(Request(scope, receive), *names)
            except RecserveError as exc:
                response = error_response(exc.status, exc.message)
            except Exception as exc:  # a bug here must answer 500 and keep serving
                log.exception("POST %s failed", path)
                response = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        await response(scope, receive, send)

    async def _predict(self, request: Request, service: str, model: str | None = None) -> Response:
        models = self._ctx.models
        label = model or service
        body = await request_body(self._ctx, request, "eas", label)
        find = (lambda: models.get(model)) if model is not None else (lambda: models.for_service(service))
        status, result = await dispatch(self._ctx, "eas", find, _handler(body))
        if status != 200:
            return error_response(status, result)
        return Response(result, media_type="application/json" if not body else PROTOBUF)
