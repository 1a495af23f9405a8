"""TF Serving's gRPC API: tensorflow.serving.PredictionService (Predict, GetModelMetadata)
and tensorflow.serving.ModelService (GetModelStatus), as TF Serving clients call them.

The services are registered by their wire names over raw bytes: recserve's messages live in
its own proto package (proto/tfserving.proto says why), so no generated servicer applies.
Predict is served by the native route (`Processor.process_tfs`: bytes to bytes in C, the
GIL released) when it takes the request -- its layout's route is compiled, its dtypes and
forms are native ones -- and otherwise parses natively or in Python
(`tfserving_codec.parse_predict_request`) and serves through `Processor.serve`: the EAS
protocol's request routes, validation and errors. Both answer the same bytes; the model,
version and label checks and the response's model_spec are Python's on both. Versions: TF
Serving numbers them; a recserve version named by digits is that number, any other name is
its checkpoint's global step. A request naming a version (or a version_label: the version's
name or number) is served only by that version, which must be the serving one (the newest,
or the pinned one). Handlers run on the gRPC server's thread pool. Thread-safe.
"""

from __future__ import annotations

import time
from typing import Any

import grpc
from google.protobuf import any_pb2

from recserve.errors import InternalError, RecserveError
from recserve.processor.processor import Processor
from recserve.processor.trace import RequestTrace
from recserve.proto import tfserving_pb2 as pb
from recserve.server.context import ServerContext
from recserve.server.dispatch import Outcome
from recserve.server.errors import UnknownModelError
from recserve.server.grpc_common import abort, check_deadline, native_declined
from recserve.server.http_status import model_status
from recserve.server.registry import ModelEntry
from recserve.wire import tfserving_codec as tfs

__all__ = ["MODEL_SERVICE", "PREDICTION_SERVICE", "TfServingServices", "version_number"]

PREDICTION_SERVICE = "tensorflow.serving.PredictionService"
MODEL_SERVICE = "tensorflow.serving.ModelService"
SIGNATURE_DEF_MAP_URL = "type.googleapis.com/tensorflow.serving.SignatureDefMap"
PREDICT_METHOD = "tensorflow/serving/predict"
ROUTE = "tfserving_grpc"

_ERROR_UNAVAILABLE = 14   # tensorflow.error.Code


def version_number(name: str | None, global_step: int | None) -> int:
    """A recserve version's TF Serving number: its name when that is digits, else its step."""
    if name is not None and name.isdigit():
        return int(name)
    return int(global_step or 0)


def _unimplemented(what: str, instead: str) -> grpc.RpcMethodHandler:
    def handler(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.abort(grpc.StatusCode.UNIMPLEMENTED, f"recserve does not implement {what}: {instead}")
        raise AssertionError("grpc.ServicerContext.abort returned")
    return grpc.unary_unary_rpc_method_handler(handler)


class TfServingServices:
    """Both services' handlers over one ServerContext."""

    def __init__(self, ctx: ServerContext) -> None:
        self._ctx = ctx
        # version name -> its number, for names that are not digits (a global step never
        # changes for a name); races only cost a recomputation.
        self._numbers: dict[str, int] = {}

    # -- versions -------------------------------------------------------------------------

    def _number(self, processor: Processor, name: str) -> int:
        if name.isdigit():
            return int(name)
        number = self._numbers.get(name)
        if number is None:
            info = processor.model_info()
            number = version_number(name, info.get("global_step") if info.get("version") == name else None)
            if len(self._numbers) < 4096:
                self._numbers[name] = number
        return number

    def _check_version(self, entry: ModelEntry, processor: Processor, spec: tfs.ModelSpec, served: str) -> int:
        """The served version's number; NOT_FOUND unless it is the version `spec` names."""
        number = self._number(processor, served)
        if spec.version is not None and spec.version != number:
            raise UnknownModelError(
                f"Servable not found for request: Specific({entry.name}, {spec.version}): model {entry.name!r} "
                f"serves version {number} (named {served!r}), the newest or the pinned one")
        if spec.version_label is not None and spec.version_label not in (served, str(number)):
            raise UnknownModelError(
                f"Unrecognized servable version label: {spec.version_label!r}: model {entry.name!r} serves "
                f"version {number} (named {served!r}); its labels are {served!r} and {str(number)!r}")
        return number

    # -- PredictionService ----------------------------------------------------------------

    def predict(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        call: tfs.TfsRequest | None = None
        spec: tfs.ModelSpec | None = None   # the leading ModelSpec, when the native route may serve

        def find() -> ModelEntry:
            nonlocal call, spec
            # A call the front end's native route declined (counted) takes the Python route.
            spec = None if native_declined(context) else tfs.leading_model_spec(request)
            if spec is not None:
                entry = self._ctx.models.entries.get(spec.name)
                if entry is not None and entry.ready:
                    return entry
                spec = None   # the full parse first: a malformed request's error comes before the model's
            call = tfs.parse_predict_request(request)
            return self._ctx.models.get(call.spec.name)

        def handle(entry: ModelEntry, processor: Processor, trace: RequestTrace) -> Outcome:
            nonlocal call
            check_deadline(context)
            if spec is not None:
                outputs = processor.process_tfs(request, trace)
                if outputs is not None:
                    return 200, outputs + self._spec_field(entry, processor, spec, trace, context)
                call = tfs.parse_predict_request(request)
                if call.spec.name != entry.name:
                    # A second model_spec merged into the first (the native parser declines
                    # those): the request is the merged spec's model's.
                    named = self._ctx.models.get(call.spec.name)
                    with named.lease() as other:
                        return self._serve_python(named, other, call, trace, context)
            assert call is not None
            return self._serve_python(entry, processor, call, trace, context)

        status, result = self._ctx.dispatcher.call(ROUTE, find, handle)
        if status != 200:
            abort(context, status, result)
        return bytes(result)

    def _spec_field(self, entry: ModelEntry, processor: Processor, spec: tfs.ModelSpec, trace: RequestTrace,
                    context: grpc.ServicerContext) -> bytes:
        """The response's model_spec field for the version `trace` names (which must be the
        one `spec` asks for: NOT_FOUND otherwise); sets the trailing metadata."""
        served = trace.model_version
        if not served:
            raise InternalError("the model answered without naming its version")
        number = self._check_version(entry, processor, spec, served)
        context.set_trailing_metadata(trace.served_by())
        return tfs.model_spec_field(entry.name, number, spec.signature_name or tfs.DEFAULT_SIGNATURE)

    def _serve_python(self, entry: ModelEntry, processor: Processor, call: tfs.TfsRequest, trace: RequestTrace,
                      context: grpc.ServicerContext) -> Outcome:
        """The Python route: what the native route answers, for every request it does not take."""
        outputs = processor.serve(call.parsed, call.decoded, trace)
        spec = self._spec_field(entry, processor, call.spec, trace, context)
        start = time.perf_counter_ns()
        response = tfs.encode_predict_outputs(outputs) + spec
        trace.add("encode", start)
        return 200, response

    def _model_and_spec(self, spec: Any, context: grpc.ServicerContext) -> tuple[ModelEntry, tfs.ModelSpec]:
        try:
            return self._ctx.models.get(spec.name), tfs.ModelSpec(
                spec.name, spec.version.value if spec.WhichOneof("version_choice") == "version" else None,
                spec.version_label if spec.WhichOneof("version_choice") == "version_label" else None,
                spec.signature_name)
        except RecserveError as exc:
            abort(context, exc.status, exc.message)

    def get_model_metadata(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            message = pb.GetModelMetadataRequest.FromString(request)
        except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError)
            abort(context, 400, f"request is not a valid tensorflow.serving.GetModelMetadataRequest: {exc}")
        fields = list(message.metadata_field)
        if not fields:
            abort(context, 400, "GetModelMetadataRequest must specify at least one metadata_field: "
                                 "recserve serves 'signature_def'")
        unknown = [f for f in fields if f != "signature_def"]
        if unknown:
            abort(context, 400, f"Metadata field {unknown[0]} is not supported; recserve serves 'signature_def'")
        entry, spec = self._model_and_spec(message.model_spec, context)
        try:
            with entry.lease() as processor:
                signatures = processor.signature_infos()
                info = processor.model_info()
                number = self._check_version(entry, processor, spec, str(info["version"]))
        except RecserveError as exc:
            abort(context, exc.status, exc.message)
        defs = pb.SignatureDefMap()
        for name, sig in signatures.items():
            target = defs.signature_def[name]
            target.method_name = PREDICT_METHOD
            for tensors, where in ((sig["inputs"], target.inputs), (sig["outputs"], target.outputs)):
                for alias, t in tensors.items():
                    info = where[alias]
                    info.name, info.dtype = t["name"], tfs.tf_dtype(t["dtype"])
                    info.tensor_shape.CopyFrom(tfs.shape_proto(t["shape"]))
        response = pb.GetModelMetadataResponse()
        response.model_spec.name = entry.name
        response.model_spec.version.value = number
        response.metadata["signature_def"].CopyFrom(
            any_pb2.Any(type_url=SIGNATURE_DEF_MAP_URL, value=defs.SerializeToString()))
        return bytes(response.SerializeToString())

    # -- ModelService ---------------------------------------------------------------------

    def get_model_status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            message = pb.GetModelStatusRequest.FromString(request)
        except Exception as exc:  # noqa: BLE001  (protobuf's DecodeError)
            abort(context, 400, f"request is not a valid tensorflow.serving.GetModelStatusRequest: {exc}")
        entry, spec = self._model_and_spec(message.model_spec, context)
        status = model_status(entry)
        response = pb.GetModelStatusResponse()
        served = status["version"]
        if served is not None:
            number = version_number(str(served), status["global_step"])
            row = response.model_version_status.add(version=number, state=pb.ModelVersionStatus.AVAILABLE)
            row.status.SetInParent()
        load = status["load"]
        if load is not None:
            loading = load["loading"].removeprefix("version ")
            row = response.model_version_status.add(
                version=version_number(loading, None), state=pb.ModelVersionStatus.LOADING)
            row.status.error_message = (f"{load['percent']}% of {load['bytes_total']} bytes, "
                                        f"ETA {load['eta_seconds']} s")
        if served is None and load is None:
            row = response.model_version_status.add(
                state=pb.ModelVersionStatus.END if status["state"] == "UNAVAILABLE" else pb.ModelVersionStatus.START)
            if status["last_error"]:
                row.status.error_code = _ERROR_UNAVAILABLE
                row.status.error_message = str(status["last_error"])
        if spec.version is not None:
            rows = [r for r in response.model_version_status if r.version == spec.version]
            if not rows:
                abort(context, 404, f"Could not find version {spec.version} of model {entry.name!r}; it has "
                                     f"{[r.version for r in response.model_version_status]}")
            del response.model_version_status[:]
            response.model_version_status.extend(rows)
        return bytes(response.SerializeToString())

    # -- registration ---------------------------------------------------------------------

    def handlers(self) -> tuple[grpc.GenericRpcHandler, ...]:
        predict_only = ("recserve serves tensorflow.serving.PredictionService's Predict and GetModelMetadata "
                        "only; send the same inputs as a PredictRequest")
        return (
            grpc.method_handlers_generic_handler(PREDICTION_SERVICE, {
                "Predict": grpc.unary_unary_rpc_method_handler(self.predict),
                "GetModelMetadata": grpc.unary_unary_rpc_method_handler(self.get_model_metadata),
                "Classify": _unimplemented("Classify", predict_only),
                "Regress": _unimplemented("Regress", predict_only),
                "MultiInference": _unimplemented("MultiInference", predict_only),
            }),
            grpc.method_handlers_generic_handler(MODEL_SERVICE, {
                "GetModelStatus": grpc.unary_unary_rpc_method_handler(self.get_model_status),
                "HandleReloadConfigRequest": _unimplemented(
                    "HandleReloadConfigRequest",
                    "models come from `recserve serve --config`; pin a version with the admin API (docs/server.md)"),
            }),
        )
