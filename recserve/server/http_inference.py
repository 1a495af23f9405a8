"""HTTP inference routes on FastAPI: TF Serving REST and KServe v2 (the EAS protobuf route
is plain ASGI in front of the app: recserve.server.http_eas).

Each route reads the body on the event loop, then hands one closure to the dispatcher on
a worker thread: decode (span "decode"), `Processor.predict`, encode (span "encode").
Route labels in metrics: tfserving, kserve.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Request, Response

from recserve.errors import RequestError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.server import kserve, tfserving
from recserve.server.context import ServerContext, check_version
from recserve.server.dispatch import Outcome
from recserve.server.http_common import PROTOBUF, Handler, dispatch, error_response, request_body
from recserve.server.registry import ModelEntry

__all__ = ["inference_router"]


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc


def _tfserving_handler(body: bytes, version: str | None) -> Handler:
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        check_version(entry, processor, version)
        with trace.span("decode"):
            doc = _json_body(body)
            name = doc.get("signature_name") if isinstance(doc, dict) else None
            call = tfserving.decode_predict(doc, processor.signature_info(name if isinstance(name, str) else None))
        outputs = processor.predict(call.inputs, None, signature_name=call.signature_name, trace=trace)
        with trace.span("encode"):
            return 200, json.dumps(tfserving.encode_predict(outputs, call.rows)).encode()
    return handle


def _kserve_handler(body: bytes, header_length: int | None, version: str | None) -> Handler:
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        check_version(entry, processor, version)
        with trace.span("decode"):
            call = kserve.decode_http_request(body, header_length, version or "")
        outputs = processor.predict(call.inputs, call.outputs, signature_name=call.signature_name, trace=trace)
        with trace.span("encode"):
            return 200, kserve.encode_http_response(entry.name, trace.model_version, call, outputs)
    return handle


def inference_router(ctx: ServerContext) -> APIRouter:
    router = APIRouter()
    models = ctx.models

    # -- TF Serving REST -------------------------------------------------------------------

    async def tf_predict(request: Request, name: str, version: str | None) -> Response:
        body = await request_body(ctx, request, "tfserving", name)
        status, result = await dispatch(ctx, "tfserving", lambda: models.get(name), _tfserving_handler(body, version))
        if status != 200:
            return error_response(status, result)
        return Response(result, media_type="application/json")

    @router.post("/v1/models/{name}:predict")
    async def tf_predict_latest(name: str, request: Request) -> Response:
        return await tf_predict(request, name, None)

    @router.post("/v1/models/{name}/versions/{version}:predict")
    async def tf_predict_version(name: str, version: str, request: Request) -> Response:
        return await tf_predict(request, name, version)

    # -- KServe v2 ---------------------------------------------------------------------------

    async def kserve_infer(request: Request, name: str, version: str | None) -> Response:
        body = await request_body(ctx, request, "kserve", name, decompress=True)
        header = request.headers.get(kserve.HEADER_LENGTH)
        if header is not None and not header.isdigit():
            raise RequestError(f"Inference-Header-Content-Length must be a byte count, got {header!r}")
        handler = _kserve_handler(body, int(header) if header is not None else None, version)
        status, result = await dispatch(ctx, "kserve", lambda: models.get(name), handler)
        if status != 200:
            return error_response(status, result)
        payload, json_length = result
        if json_length is None:
            return Response(payload, media_type="application/json")
        return Response(payload, media_type=PROTOBUF,
                        headers={"Inference-Header-Content-Length": str(json_length)})

    @router.post("/v2/models/{name}/infer")
    async def kserve_infer_latest(name: str, request: Request) -> Response:
        return await kserve_infer(request, name, None)

    @router.post("/v2/models/{name}/versions/{version}/infer")
    async def kserve_infer_version(name: str, version: str, request: Request) -> Response:
        return await kserve_infer(request, name, version)

    return router
