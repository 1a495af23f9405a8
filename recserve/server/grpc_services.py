"""The gRPC server: tensorflow.eas PredictionService, KServe v2
inference.GRPCInferenceService, TF Serving's PredictionService and ModelService
(recserve.server.tfserving_grpc), and grpc.health.v1.

Predict takes and returns raw bytes (no protobuf round trip in Python: the bytes go to
`Processor.process` as the C ABI's do). ModelInfer decodes raw or typed input contents
and answers raw output contents. Health's Check answers SERVING when the server (service
"" or one of the two service names) or the named model is ready. Handlers run on the
server's thread pool. Thread-safe.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from recserve import __version__
from recserve.errors import RecserveError, RequestError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.proto import grpc_predict_v2_pb2 as v2
from recserve.proto import grpc_predict_v2_pb2_grpc as v2_grpc
from recserve.server import kserve
from recserve.server.context import ServerContext, check_version
from recserve.server.dispatch import Outcome
from recserve.server.grpc_common import abort, check_deadline, native_declined
from recserve.server.registry import ModelEntry
from recserve.server.tfserving_grpc import MODEL_SERVICE, PREDICTION_SERVICE, TfServingServices

__all__ = ["EAS_SERVICE", "KSERVE_SERVICE", "SERVER_SERVICES", "HealthService", "build_grpc_server", "call_limit"]

EAS_SERVICE = "tensorflow.eas.PredictionService"
KSERVE_SERVICE = "inference.GRPCInferenceService"
MODEL_METADATA_KEY = "model"
# The names Health answers the whole server's status for.
SERVER_SERVICES = ("", EAS_SERVICE, KSERVE_SERVICE, PREDICTION_SERVICE, MODEL_SERVICE)


def _metadata_model(context: grpc.ServicerContext) -> str | None:
    for key, value in context.invocation_metadata():
        if key == MODEL_METADATA_KEY:
            return str(value)
    return None


class EasPredictionService:
    """tensorflow.eas.PredictionService over raw bytes."""

    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx

    def _find(self, context: grpc.ServicerContext) -> ModelEntry:
        name = _metadata_model(context)
        models = self._ctx.models
        if name is not None:
            return models.get(name)
        if len(models.entries) == 1:
            return next(iter(models.entries.values()))
        raise RequestError(
            f"this server serves several models {models.names()}: name one in the call's "
            f"metadata key {MODEL_METADATA_KEY!r}")

    def predict(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
            check_deadline(context)
            if not request:  # an empty PredictRequest: process() would answer the signature JSON
                raise RequestError("PredictRequest has no inputs; the signature is: "
                                   + json.dumps(processor.signature_info()))
            if native_declined(context):  # the front end's native route declined it, counted
                status, result = processor.process_python(request, trace=trace)
            else:
                status, result = processor.process(request, trace=trace)
            if status == 200:
                entry.record(request)
                context.set_trailing_metadata(trace.served_by())
            return status, result

        status, result = self._ctx.dispatcher.call("eas_grpc", lambda: self._find(context), handle)
        if status != 200:
            abort(context, status, result)
        return bytes(result)

    def model_info(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            entry = self._find(context)
            with entry.lease() as processor:
                return processor.model_info_bytes()
        except RecserveError as exc:
            abort(context, exc.status, exc.message)

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(EAS_SERVICE, {
            "Predict": grpc.unary_unary_rpc_method_handler(self.predict),
            "GetServingModelInfo": grpc.unary_unary_rpc_method_handler(self.model_info),
        })


class KServeService(v2_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService (KServe v2)."""

    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx

    def ServerLive(self, request: v2.ServerLiveRequest, context: grpc.ServicerContext) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    def ServerReady(self, request: v2.ServerReadyRequest, context: grpc.ServicerContext) -> v2.ServerReadyResponse:
        return v2.ServerReadyResponse(ready=self._ctx.models.ready)

    def _entry(self, name: str, context: grpc.ServicerContext) -> ModelEntry:
        entry = self._ctx.models.entries.get(name)
        if entry is None:
            abort(context, 404, f"unknown model {name!r}; this server serves {self._ctx.models.names()}")
        return entry

    def ModelReady(self, request: v2.ModelReadyRequest, context: grpc.ServicerContext) -> v2.ModelReadyResponse:
        entry = self._entry(request.name, context)
        processor = entry.processor
        ready = entry.ready and processor is not None and (
            not request.version or str(processor.model_info().get("version")) == request.version)
        return v2.ModelReadyResponse(ready=ready)

    def ServerMetadata(
        self, request: v2.ServerMetadataRequest, context: grpc.ServicerContext
    ) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(name="recserve", version=__version__, extensions=[])

    def ModelMetadata(
        self, request: v2.ModelMetadataRequest, context: grpc.ServicerContext
    ) -> v2.ModelMetadataResponse:
        entry = self._entry(request.name, context)
        try:
            with entry.lease() as processor:
                check_version(entry, processor, request.version)
                sig = processor.signature_info()
                version = str(processor.model_info()["version"])
        except RecserveError as exc:
            abort(context, exc.status, exc.message)
        response = v2.ModelMetadataResponse(name=entry.name, versions=[version], platform="onnxruntime_onnx")
        for tensors, target in ((sig["inputs"], response.inputs), (sig["outputs"], response.outputs)):
            for t in kserve.tensor_metadata(tensors):
                target.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        return response

    def ModelInfer(self, request: v2.ModelInferRequest, context: grpc.ServicerContext) -> v2.ModelInferResponse:
        def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
            check_deadline(context)
            check_version(entry, processor, request.model_version)
            with trace.span("decode"):
                call = kserve.decode_grpc_request(request)
            outputs = processor.predict(call.inputs, call.outputs, signature_name=call.signature_name, trace=trace)
            context.set_trailing_metadata(trace.served_by())
            with trace.span("encode"):
                return 200, kserve.encode_grpc_response(entry.name, trace.model_version, call, outputs)

        status, result = self._ctx.dispatcher.call(
            "kserve_grpc", lambda: self._ctx.models.get(request.model_name), handle)
        if status != 200:
            abort(context, status, result)
        return result  # type: ignore[no-any-return]


class HealthService(health_pb2_grpc.HealthServicer):
    """grpc.health.v1: Check, and Watch streaming every change. Statuses are computed at each
    look: "" and the service names mean every model; a model's name means that model."""

    # How often a Watch looks again; shutdown wakes it at once.
    WATCH_POLL_SECONDS = 0.2

    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx

    def _status(self, service: str) -> Any:
        """The service's status, or None when there is no such service."""
        models = self._ctx.models
        if service in SERVER_SERVICES:
            ready = models.ready
        elif service in models.entries:
            ready = models.entries[service].ready and not models.draining
        else:
            return None
        return health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING

    def Check(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> Any:
        status = self._status(request.service)
        if status is None:
            abort(context, 404, f"unknown service {request.service!r}")
        return health_pb2.HealthCheckResponse(status=status)

    def Watch(self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        """The status now, then each change (SERVICE_UNKNOWN for a name no model has, as the
        protocol asks). On shutdown the last message is NOT_SERVING and the stream ends, so
        open watches never hold the server's grace period."""
        last = None
        while True:
            # Read before the status: a stream that ends because shutdown began has sent a
            # status computed after it began (shutdown may start while a message is sent).
            draining = self._ctx.models.draining
            status = self._status(request.service)
            if status is None:
                status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
            if status != last:
                yield health_pb2.HealthCheckResponse(status=status)
                last = status
            if draining or not context.is_active():
                return
            self._ctx.models.wait_draining(self.WATCH_POLL_SECONDS)


# Health Watch streams are long-lived calls: room for them beyond the predictions'.
WATCH_HEADROOM = 64


def call_limit(ctx: ServerContext, workers: int) -> int:
    """Calls the gRPC port takes at once; beyond, RESOURCE_EXHAUSTED before being read.
    Admission for gRPC: the workers plus every model's max_queued_requests, and room for
    Health watches (grpc's sync server queues calls where recserve cannot see them)."""
    queued = sum(entry.config.max_queued_requests for entry in ctx.models.entries.values())
    return workers + queued + WATCH_HEADROOM


def build_grpc_server(ctx: ServerContext, address: str, *, workers: int, reuse_port: bool = False) -> grpc.Server:
    """A started-later grpcio server bound to `address` (host:port, or a Unix socket behind
    the front end: recserve.server.grpc_front); RuntimeError if it is taken."""
    limit = ctx.settings.max_request_bytes
    # Refusals beyond the call limit are grpcio's, in its polling thread in Python: under
    # overload a refusal waits for the GIL too (the C++ front end's do not).
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="recserve-grpc"),
        maximum_concurrent_rpcs=call_limit(ctx, workers),
        options=[
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", -1),
            # A taken port is an error, not a shared one; worker processes share theirs.
            ("grpc.so_reuseport", int(reuse_port)),
        ],
    )
    server.add_generic_rpc_handlers((EasPredictionService(ctx).handler(), *TfServingServices(ctx).handlers()))
    v2_grpc.add_GRPCInferenceServiceServicer_to_server(KServeService(ctx), server)  # type: ignore[no-untyped-call]
    health_pb2_grpc.add_HealthServicer_to_server(HealthService(ctx), server)
    server.add_insecure_port(address)
    return server
