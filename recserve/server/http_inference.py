"""TF Serving REST predictions on FastAPI (the EAS and KServe v2 prediction routes are plain
ASGI in front of the app: recserve.server.http_predict_routes).

A route reads the body on the event loop, then hands one closure to the dispatcher on a
worker thread: decode (span "decode"), `Processor.predict`, encode (span "encode").
Route label in metrics: tfserving.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response

from recserve.errors import RequestError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.server import tfserving
from recserve.server.context import ServerContext, check_version
from recserve.server.dispatch import Outcome
from recserve.server.http_common import Handler, dispatch, error_response, request_body, served_headers
from recserve.server.registry import ModelEntry

__all__ = ["inference_router"]


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise RequestError(f"request body is not valid JSON: {exc}") from exc


def _tfserving_handler(body: bytes, version: str | None, served: list[RequestTrace]) -> Handler:
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        served.append(trace)
        check_version(entry, processor, version)
        with trace.span("decode"):
            doc = _json_body(body)
            name = doc.get("signature_name") if isinstance(doc, dict) else None
            call = tfserving.decode_predict(doc, processor.signature_info(name if isinstance(name, str) else None))
        outputs = processor.predict(call.inputs, None, signature_name=call.signature_name, trace=trace)
        with trace.span("encode"):
            return 200, json.dumps(tfserving.encode_predict(outputs, call.rows)).encode()
    return handle


def inference_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    models = ctx.models

    # -- TF Serving REST -------------------------------------------------------------------

    async def tf_predict(request: Request, name: str, version: str | None) -> Response:
        body = await request_body(ctx, request, "tfserving", name)
        served: list[RequestTrace] = []
        status, result = await dispatch(
            ctx, "tfserving", name, len(body), lambda: models.get(name), _tfserving_handler(body, version, served))
        if status != 200:
            return error_response(status, result)
        return Response(result, media_type="application/json", headers=served_headers(served))

    @router.post("/v1/models/{name}:predict")
    async def tf_predict_latest(name: str, request: Request) -> Response:
        return await tf_predict(request, name, None)

    @router.post("/v1/models/{name}/versions/{version}:predict")
    async def tf_predict_version(name: str, version: str, request: Request) -> Response:
        return await tf_predict(request, name, version)

    return router
