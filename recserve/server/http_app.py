"""The FastAPI application: routes of every HTTP protocol, one JSON error shape.

Every non-200 answer is ``{"error": "<message>"}``. Request bodies are read as raw bytes
(no pydantic over tensors) and bounded by max_request_bytes; predictions run on worker
threads through the dispatcher, so the event loop only moves bytes.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from recserve import __version__
from recserve.errors import RecserveError
from recserve.server.context import ServerContext
from recserve.server.http_common import error_response
from recserve.server.http_predict_routes import PredictRoutes
from recserve.server.http_status import status_router

__all__ = ["build_app"]

log = logging.getLogger("recserve.server")


def build_app(ctx: ServerContext) -> PredictRoutes:
    """The server's ASGI app: the EAS, KServe and TF Serving prediction routes in front of
    the FastAPI app of all the others."""
    app = FastAPI(title="recserve", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RecserveError)
    async def _recserve_error(request: Request, exc: RecserveError) -> JSONResponse:
        return error_response(exc.status, exc.message)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and message == "Not Found":
            message = f"no route {request.method} {request.url.path}; see docs/server.md for the routes"
        return error_response(exc.status_code, message)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(400, str(exc))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(request: Request, exc: ClientDisconnect) -> Response:
        ctx.metrics.client_disconnects.labels("other").inc()
        log.debug("%s %s: the client went away before the answer", request.method, request.url.path)
        return Response(status_code=499)  # nobody reads it: the connection is gone

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("%s %s failed", request.method, request.url.path)
        return error_response(500, f"internal error: {type(exc).__name__}: {exc}")

    app.include_router(status_router(ctx))
    return PredictRoutes(app, ctx)
