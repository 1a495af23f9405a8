"""HTTP inference routes: EAS/DeepRec protobuf, TF Serving REST, KServe v2.

Each route reads the body on the event loop, then hands one closure to the dispatcher on
a worker thread: decode (span "decode"), `Processor.predict`/`process`, encode (span
"encode"). Route labels in metrics: eas, tfserving, kserve.
"""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Request, Response

from recserve.errors import RecserveError, RequestError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.server import kserve, tfserving
from recserve.server.context import ServerContext, check_version
from recserve.server.dispatch import UNKNOWN_MODEL, Outcome
from recserve.server.http_common import error_response, read_body
from recserve.server.registry import ModelEntry

__all__ = ["inference_router"]

PROTOBUF = "application/octet-stream"
Handler = Callable[[ModelEntry, Processor, RequestTrace], Outcome]


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc


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


def _eas_handler(body: bytes) -> Handler:
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        return processor.process(body, trace=trace)
    return handle


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
    limit = ctx.settings.max_request_bytes
    models = ctx.models

    async def dispatch(route: str, find: Callable[[], ModelEntry], handler: Handler) -> Outcome:
        # asyncio's executor hop costs less CPU per request than anyio's to_thread.
        return await asyncio.get_running_loop().run_in_executor(
            ctx.workers, ctx.dispatcher.call, route, find, handler)

    async def body_of(request: Request, route: str, model: str) -> bytes:
        """The body; a refusal before any model is reached (too large, bad encoding) is
        counted like every other answer."""
        try:
            body = await read_body(request, limit)
            return _decompressed(request, body) if route == "kserve" else body
        except RecserveError as exc:
            label = model if model in models.entries else UNKNOWN_MODEL
            ctx.metrics.observe(label, route, exc.status, 0.0, RequestTrace())
            raise

    # -- EAS / DeepRec: PredictRequest bytes in, PredictResponse bytes out ----------------

    async def eas(request: Request, label: str, find: Callable[[], ModelEntry]) -> Response:
        body = await body_of(request, "eas", label)
        status, result = await dispatch("eas", find, _eas_handler(body))
        if status != 200:
            return error_response(status, result)
        return Response(result, media_type="application/json" if not body else PROTOBUF)

    @router.post("/api/predict/{service}")
    async def eas_service(service: str, request: Request) -> Response:
        return await eas(request, service, lambda: models.for_service(service))

    @router.post("/api/predict/{service}/{model}")
    async def eas_model(service: str, model: str, request: Request) -> Response:
        return await eas(request, model, lambda: models.get(model))

    # -- TF Serving REST -------------------------------------------------------------------

    async def tf_predict(request: Request, name: str, version: str | None) -> Response:
        body = await body_of(request, "tfserving", name)
        status, result = await dispatch("tfserving", lambda: models.get(name), _tfserving_handler(body, version))
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
        body = await body_of(request, "kserve", name)
        header = request.headers.get(kserve.HEADER_LENGTH)
        if header is not None and not header.isdigit():
            raise RequestError(f"Inference-Header-Content-Length must be a byte count, got {header!r}")
        handler = _kserve_handler(body, int(header) if header is not None else None, version)
        status, result = await dispatch("kserve", lambda: models.get(name), handler)
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
