"""The prediction routes clients call at high rates, as plain ASGI in front of the FastAPI
app that serves every other route:

- EAS/DeepRec `POST /api/predict/{service}[/{model}]`: PredictRequest bytes in,
  `Processor.process`, PredictResponse bytes out (an empty body asks for the signature);
- KServe v2 `POST /v2/models/{name}[/versions/{version}]/infer`: JSON or binary tensors;
- TF Serving REST `POST /v1/models/{name}[/versions/{version}]:predict`: JSON (`instances`
  or `inputs`), decoded on the handler's thread (span "decode"), `Processor.predict`,
  encoded (span "encode").

FastAPI's routing and dependency solving cost more CPU than a small prediction: server CPU
per batch-1 EAS request of the demo model measured ~820-1,040 us through FastAPI and
~580-670 us here (uvicorn alone with the worker-thread hop: ~200-300 us). Answers keep
FastAPI's shapes: JSON errors, 405 with Allow, one trailing slash accepted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from recserve.errors import RecserveError, RequestError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.server import kserve, tfserving
from recserve.server.context import ServerContext, check_version
from recserve.server.dispatch import Outcome
from recserve.server.http_common import (
    PROTOBUF,
    Handler,
    dispatch,
    error_response,
    received_at,
    request_body,
    request_deadline,
    served_headers,
)
from recserve.server.registry import ModelEntry

__all__ = ["PredictCall", "PredictRoutes", "eas_handler", "eas_response", "match", "predict_call", "route_model",
           "tfserving_handler"]

log = logging.getLogger("recserve.server")

EAS_PREFIX = "/api/predict/"
KSERVE_PREFIX, KSERVE_SUFFIX = "/v2/models/", "/infer"
TFS_PREFIX, TFS_SUFFIX = "/v1/models/", ":predict"


def match(path: str) -> tuple[str, tuple[str, ...]] | None:
    """("eas", (service[, model])), ("kserve", (name[, version])) or ("tfserving", (name[,
    version])) for a prediction route's path, else None. Names are whole path segments, as
    FastAPI's {name} matches them."""
    path = path.removesuffix("/")  # FastAPI would have redirected to it
    if path.startswith(EAS_PREFIX):
        names = tuple(path[len(EAS_PREFIX):].split("/"))
        if len(names) <= 2 and all(names):
            return "eas", names
        return None
    # KServe v2 and TF Serving REST: <prefix><model>[/versions/<version>]<suffix>
    for route, prefix, suffix in (("kserve", KSERVE_PREFIX, KSERVE_SUFFIX), ("tfserving", TFS_PREFIX, TFS_SUFFIX)):
        if path.startswith(prefix) and path.endswith(suffix):
            parts = path[len(prefix):-len(suffix)].split("/")
            if len(parts) == 1 and parts[0]:
                return route, (parts[0],)
            if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
                return route, (parts[0], parts[2])
            return None
    return None


@dataclass
class PredictCall:
    """One prediction request, ready to dispatch: which model (`model`, the name the URL gives,
    found by `find`), what runs on it (`handler`), and how its outcome becomes an answer."""

    route: str  # "eas", "kserve" or "tfserving"
    model: str
    find: Callable[[], ModelEntry]
    handler: Handler
    respond: Callable[[Outcome], Response]
    served: list[RequestTrace]  # the trace of the handler's run, once it ran


def route_model(kind: str, names: tuple[str, ...]) -> str:
    """The model name a route `match` found gives: EAS's model, else its service; KServe's
    and TF Serving's name."""
    return names[-1] if kind == "eas" else names[0]


def predict_call(ctx: ServerContext, kind: str, names: tuple[str, ...], body: bytes,
                 header_length: str | None = None) -> PredictCall:
    """The call for a route `match` found (`kind`, `names`) and its whole (decompressed) body;
    `header_length`: KServe's Inference-Header-Content-Length header, if sent."""
    served: list[RequestTrace] = []
    if kind == "eas":
        service, model = names[0], names[1] if len(names) > 1 else None
        models = ctx.models
        find = (lambda: models.get(model)) if model is not None else (lambda: models.for_service(service))

        def respond_eas(outcome: Outcome) -> Response:
            status, result = outcome
            if status != 200:
                return error_response(status, result)
            return Response(result, media_type="application/json" if not body else PROTOBUF,
                            headers=served_headers(served))
        return PredictCall("eas", route_model(kind, names), find, eas_handler(body, served), respond_eas, served)
    name, version = names[0], names[1] if len(names) > 1 else None
    if kind == "tfserving":
        def respond_tfserving(outcome: Outcome) -> Response:
            status, result = outcome
            if status != 200:
                return error_response(status, result)
            return Response(result, media_type="application/json", headers=served_headers(served))
        return PredictCall("tfserving", name, lambda: ctx.models.get(name), tfserving_handler(body, version, served),
                           respond_tfserving, served)
    if header_length is not None and not header_length.isdigit():
        raise RequestError(f"Inference-Header-Content-Length must be a byte count, got {header_length!r}")

    def respond_kserve(outcome: Outcome) -> Response:
        status, result = outcome
        if status != 200:
            return error_response(status, result)
        payload, json_length = result
        headers = served_headers(served)
        if json_length is None:
            return Response(payload, media_type="application/json", headers=headers)
        return Response(payload, media_type=PROTOBUF, headers={kserve.HEADER_LENGTH: str(json_length), **headers})
    handler = _kserve_handler(body, int(header_length) if header_length is not None else None, version, served)
    return PredictCall("kserve", route_model(kind, names), lambda: ctx.models.get(name), handler, respond_kserve,
                       served)


def eas_response(outcome: Outcome, trace: RequestTrace | None) -> Response:
    """The answer to a merged EAS request (recserve.server.merging): PredictResponse bytes
    and the answering version's headers, or the JSON error."""
    status, result = outcome
    if status != 200:
        return error_response(status, result)
    return Response(result, media_type=PROTOBUF, headers=served_headers([trace] if trace is not None else []))


def eas_handler(body: bytes, served: list[RequestTrace]) -> Handler:
    """Processor.process on a PredictRequest's bytes; the request's trace is appended to `served`."""
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        served.append(trace)
        status, result = processor.process(body, trace=trace)
        if status == 200 and body:  # an empty body asked for the signature
            entry.record(body)
        return status, result
    return handle


def _json_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise RequestError(f"request body is not valid JSON: {exc}") from exc


def tfserving_handler(body: bytes, version: str | None, served: list[RequestTrace]) -> Handler:
    """A TF Serving REST predict's JSON body decoded (span "decode"), run, its answer's JSON
    (span "encode")."""
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        served.append(trace)
        check_version(entry, processor, version)
        with trace.span("decode"):
            doc = _json_body(body)
            name = doc.get("signature_name") if isinstance(doc, dict) else None
            call = tfserving.decode_predict(doc, processor.signature_description(name if isinstance(name, str) else None))
        outputs = processor.predict(call.inputs, None, signature_name=call.signature_name, trace=trace)
        with trace.span("encode"):
            return 200, json.dumps(tfserving.encode_predict(outputs, call.rows)).encode()
    return handle


def _kserve_handler(body: bytes, header_length: int | None, version: str | None,
                    served: list[RequestTrace]) -> Handler:
    def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
        served.append(trace)
        check_version(entry, processor, version)
        # trace.add, not trace.span's generator: this is on every request (a failed stage's
        # span is never read: only a 200's stages are counted and written to timelines).
        started = time.perf_counter_ns()
        call = kserve.decode_http_request(body, header_length, version or "")
        trace.add("decode", started)
        outputs = processor.predict(call.inputs, call.outputs, signature_name=call.signature_name, trace=trace)
        started = time.perf_counter_ns()
        answer = kserve.encode_http_response(entry.name, trace.model_version, call, outputs)
        trace.add("encode", started)
        return 200, answer
    return handle


class PredictRoutes:
    """ASGI: the prediction routes themselves, everything else to `app`. Stateless; serves
    any number of concurrent requests."""

    def __init__(self, app: ASGIApp, ctx: ServerContext) -> None:
        self._app = app
        self._ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = match(scope["path"]) if scope["type"] == "http" else None
        if route is None:
            await self._app(scope, receive, send)  # another route, or a 404 of FastAPI's
            return
        if scope["method"] != "POST":
            response: Response = error_response(405, "Method Not Allowed")
            response.headers["Allow"] = "POST"
        else:
            kind, names = route
            request = Request(scope, receive)
            try:
                response = await self._predict(request, kind, names)
            except RecserveError as exc:
                response = error_response(exc.status, exc.message)
            except ClientDisconnect:
                # Routine for clients with timeouts of their own: counted, never a traceback.
                self._ctx.metrics.client_disconnects.labels(kind).inc()
                log.debug("POST %s: the client went away before the answer", scope["path"])
                return
            except Exception as exc:  # a bug here must answer 500 and keep serving
                log.exception("POST %s failed", scope["path"])
                response = error_response(500, f"internal error: {type(exc).__name__}: {exc}")
        await response(scope, receive, send)

    async def _predict(self, request: Request, kind: str, names: tuple[str, ...]) -> Response:
        body = await request_body(self._ctx, request, kind, route_model(kind, names), decompress=kind == "kserve")
        arrived = received_at(request)
        deadline = request_deadline(request, arrived)
        call = predict_call(self._ctx, kind, names, body, request.headers.get(kserve.HEADER_LENGTH))
        if kind == "eas" and body:
            merged = await self._merged(call, body, arrived, deadline)
            if merged is not None:
                return merged
        outcome = await dispatch(self._ctx, call.route, call.model, len(body), call.find, call.handler,
                                 deadline, arrived)
        return call.respond(outcome)

    async def _merged(self, call: PredictCall, body: bytes, arrived: float, deadline: float | None) -> Response | None:
        """The answer of an EAS request whose model merges requests (recserve.server.merging);
        None when it does not (or is unknown: the dispatcher answers that)."""
        try:
            entry = call.find()
        except RecserveError:
            return None
        merger = self._ctx.merger
        if not merger.merges(entry):
            return None
        answered: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        merger.add(entry, body, arrived, deadline,
                   lambda outcome, trace: answered.done() or answered.set_result(eas_response(outcome, trace)))
        return await answered
