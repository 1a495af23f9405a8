"""The inputs a deployment serves, asked of the deployment itself over the protocol under
test: EAS's empty request (answered with the signature JSON), KServe v2 model metadata
(HTTP or gRPC; also used for eas-grpc, which has no metadata call of its own), TF
Serving's `/metadata` and its gRPC GetModelMetadata. Every answer becomes {input alias:
TensorSpec}.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import numpy as np

from recserve.errors import RecserveError
from recserve.wire.kserve_datatypes import datatype_of

__all__ = ["TensorSpec", "fetch_signature", "http_error_text"]


@dataclass(frozen=True)
class TensorSpec:
    dtype: np.dtype[Any]              # object for strings
    shape: tuple[int | None, ...]     # None: free (the batch dimension, list lengths)


_KSERVE = {datatype_of(np.empty(0, t)): np.dtype(t) for t in
           (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64,
            np.float16, np.float32, np.float64)} | {"BYTES": np.dtype(object)}
_TF = {"DT_FLOAT": "float32", "DT_DOUBLE": "float64", "DT_HALF": "float16", "DT_STRING": "string"}


def _dtype(name: str, what: str) -> np.dtype[Any]:
    try:
        return np.dtype(object) if name in ("string", "bytes") else np.dtype(name)
    except TypeError:
        raise RecserveError(f"the served signature gives {what} dtype {name!r}, which recserve perf cannot "
                            "synthesize; pass --requests FILE") from None


def _shape(dims: Any) -> tuple[int | None, ...]:
    return tuple(None if int(d) < 0 else int(d) for d in dims)


def http_error_text(exc: urllib.error.URLError, what: str) -> str:
    """One line for a failed HTTP call: the status and the server's message, or why no
    connection was made."""
    if isinstance(exc, urllib.error.HTTPError):
        body = exc.read(300).decode(errors="replace").strip().replace("\n", " ")
        return f"{what} answered {exc.code}: {body}"
    return f"{what} failed: {exc.reason}"


def _http(method: str, url: str, body: bytes | None, timeout: float) -> Any:
    request = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
    except urllib.error.URLError as exc:
        raise RecserveError(http_error_text(exc, f"{method} {url}") + " (is the server up, and are --url, "
                            "--protocol and --model right?)") from exc
    except http.client.HTTPException:
        raise RecserveError(f"{method} {url}: the answer is not HTTP/1.1 (is --protocol right, or is this a gRPC "
                            "port?)") from None
    except OSError as exc:
        raise RecserveError(f"{method} {url} failed: {exc}") from exc
    try:
        return json.loads(data)
    except ValueError:
        raise RecserveError(f"{method} {url} did not answer JSON (is --protocol right?): {data[:100]!r}") from None


def _from_eas(doc: Any) -> dict[str, TensorSpec]:
    return {alias: TensorSpec(_dtype(t["dtype"], alias), _shape(t["shape"])) for alias, t in doc["inputs"].items()}


def _from_kserve(inputs: Any) -> dict[str, TensorSpec]:
    out = {}
    for t in inputs:
        if t["datatype"] not in _KSERVE:
            _dtype(t["datatype"], t["name"])
        out[t["name"]] = TensorSpec(_KSERVE.get(t["datatype"], np.dtype(object)), _shape(t["shape"]))
    return out


def _from_tfserving(doc: Any) -> dict[str, TensorSpec]:
    defs = doc["metadata"]["signature_def"]["signature_def"]
    signature = defs.get("serving_default") or next(iter(defs.values()))
    out = {}
    for alias, t in signature["inputs"].items():
        name = _TF.get(t["dtype"], t["dtype"].removeprefix("DT_").lower())
        out[alias] = TensorSpec(_dtype(name, alias), _shape(d["size"] for d in t["tensor_shape"]["dim"]))
    return out


def _grpc_metadata(target: str, model: str, timeout: float) -> dict[str, TensorSpec]:
    import grpc

    from recserve.proto import grpc_predict_v2_pb2 as v2

    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelMetadata",
                                   request_serializer=v2.ModelMetadataRequest.SerializeToString,
                                   response_deserializer=v2.ModelMetadataResponse.FromString)
        try:
            response = call(v2.ModelMetadataRequest(name=model), timeout=timeout)
        except grpc.RpcError as exc:
            raise RecserveError(f"gRPC ModelMetadata({model!r}) at {target} failed: {exc.code().name}: "
                                f"{exc.details()} (is the server up, and are --url, --protocol and --model right? "
                                "Without KServe metadata, pass --requests FILE)") from None
    return _from_kserve([{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in response.inputs])


def _tfserving_grpc_metadata(target: str, model: str, timeout: float) -> dict[str, TensorSpec]:
    import grpc

    from recserve.proto import tfserving_pb2 as tfs
    from recserve.wire.tfserving_codec import numpy_of_dtype

    request = tfs.GetModelMetadataRequest(model_spec=tfs.ModelSpec(name=model), metadata_field=["signature_def"])
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary("/tensorflow.serving.PredictionService/GetModelMetadata",
                                   request_serializer=tfs.GetModelMetadataRequest.SerializeToString,
                                   response_deserializer=tfs.GetModelMetadataResponse.FromString)
        try:
            response = call(request, timeout=timeout)
        except grpc.RpcError as exc:
            raise RecserveError(f"gRPC GetModelMetadata({model!r}) at {target} failed: {exc.code().name}: "
                                f"{exc.details()} (is the server up, and are --url, --protocol and --model right? "
                                "Without TF Serving metadata, pass --requests FILE)") from None
    defs = tfs.SignatureDefMap.FromString(response.metadata["signature_def"].value).signature_def
    signature = defs["serving_default"] if "serving_default" in defs else next(iter(defs.values()))
    out = {}
    for alias, t in signature.inputs.items():
        dtype = numpy_of_dtype(t.dtype)
        if dtype is None:
            _dtype(tfs.DataType.Name(t.dtype) if t.dtype in tfs.DataType.values() else str(t.dtype), alias)
        out[alias] = TensorSpec(dtype, _shape(d.size for d in t.tensor_shape.dim))  # type: ignore[arg-type]
    return out


def fetch_signature(protocol: str, url: str, model: str, timeout: float = 10.0) -> dict[str, TensorSpec]:
    """The served request inputs, by alias. Raises RecserveError with one clear line when
    the target cannot be reached or does not speak `protocol`."""
    name = quote(model, safe="")
    try:
        if protocol == "eas-http":
            return _from_eas(_http("POST", f"{url}/api/predict/{name}", b"", timeout))
        if protocol == "kserve-http":
            return _from_kserve(_http("GET", f"{url}/v2/models/{name}", None, timeout)["inputs"])
        if protocol == "tfserving":
            return _from_tfserving(_http("GET", f"{url}/v1/models/{name}/metadata", None, timeout))
        if protocol == "tfserving-grpc":
            return _tfserving_grpc_metadata(url, model, timeout)
        return _grpc_metadata(url, model, timeout)
    except (KeyError, TypeError, ValueError, StopIteration, AttributeError) as exc:
        raise RecserveError(f"the signature {protocol} served at {url} has an unexpected shape ({exc!r}); "
                            "is --protocol right?") from None
