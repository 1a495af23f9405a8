"""Requests as each protocol sends them, built once before the load starts so that the
clients spend their CPU on sending, not encoding.

HTTP protocols become the whole HTTP/1.1 request (head and body), sent as it is on a
keep-alive connection; gRPC protocols become the method path and the serialized message.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit

import numpy as np

from recserve.wire.codec import encode_request
from recserve.wire.kserve_datatypes import datatype_of
from recserve.wire.tfserving_codec import encode_predict_request

# recserve.proto.grpc_predict_v2_pb2 is imported where a gRPC KServe payload is built, not
# here: its "inference" messages cannot share a process's protobuf pool with tritonclient.grpc's.

__all__ = ["EAS_GRPC_METHOD", "KSERVE_GRPC_METHOD", "TFSERVING_GRPC_METHOD", "Payload", "build_payload",
           "request_path"]

EAS_GRPC_METHOD = "/tensorflow.eas.PredictionService/Predict"
KSERVE_GRPC_METHOD = "/inference.GRPCInferenceService/ModelInfer"
TFSERVING_GRPC_METHOD = "/tensorflow.serving.PredictionService/Predict"
KSERVE_HEADER = "Inference-Header-Content-Length"


@dataclass(frozen=True)
class Payload:
    """One request ready to send: raw HTTP/1.1 bytes, or a gRPC method and message bytes."""

    data: bytes        # what goes on the wire: the whole HTTP request, or the gRPC message
    rows: int
    method: str = ""   # gRPC method path; empty for HTTP
    path: str = ""     # HTTP: the path, body and headers `data` was built from
    body: bytes = b""
    headers: Mapping[str, str] = field(default_factory=dict)


def request_path(protocol: str, model: str) -> str:
    """The HTTP path a protocol posts to ("" for gRPC)."""
    name = quote(model, safe="")
    return {"eas-http": f"/api/predict/{name}", "kserve-http": f"/v2/models/{name}/infer",
            "tfserving": f"/v1/models/{name}:predict"}.get(protocol, "")


def _rows(inputs: Mapping[str, np.ndarray]) -> int:
    return int(next(iter(inputs.values())).shape[0]) if inputs else 0


def _bytes_tensor(values: np.ndarray) -> bytes:
    items = [v if isinstance(v, bytes) else str(v).encode() for v in values.ravel()]
    return b"".join(len(v).to_bytes(4, "little") + v for v in items)


def _raw(value: np.ndarray) -> tuple[str, bytes]:
    if value.dtype == object or value.dtype.kind in "SU":
        return "BYTES", _bytes_tensor(value)
    return datatype_of(value), np.ascontiguousarray(value).tobytes()


def _kserve_http_body(inputs: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, str]]:
    """The binary-data extension, as tritonclient.http sends it: JSON head, then raw tensors."""
    specs, raw = [], []
    for name, value in inputs.items():
        datatype, data = _raw(value)
        specs.append({"name": name, "shape": list(value.shape), "datatype": datatype,
                      "parameters": {"binary_data_size": len(data)}})
        raw.append(data)
    head = json.dumps({"inputs": specs, "parameters": {"binary_data_output": True}}).encode()
    return head + b"".join(raw), {KSERVE_HEADER: str(len(head)), "Content-Type": "application/octet-stream"}


def kserve_grpc_message(inputs: Mapping[str, np.ndarray], model: str) -> bytes:
    """A KServe v2 ModelInferRequest with raw input contents, as tritonclient.grpc sends it."""
    from recserve.proto import grpc_predict_v2_pb2 as v2

    request = v2.ModelInferRequest(model_name=model)
    for name, value in inputs.items():
        datatype, data = _raw(value)
        request.inputs.add(name=name, datatype=datatype, shape=list(value.shape))
        request.raw_input_contents.append(data)
    return request.SerializeToString()


def _json_value(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode()
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    return value


def _tfserving_body(inputs: Mapping[str, np.ndarray]) -> bytes:
    doc = {"inputs": {name: (np.vectorize(_json_value, otypes=[object])(v).tolist() if v.dtype == object
                             else v.tolist()) for name, v in inputs.items()}}
    return json.dumps(doc).encode()


def _http_request(url: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    head = [f"POST {path} HTTP/1.1", f"Host: {urlsplit(url).netloc}", f"Content-Length: {len(body)}",
            *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def build_payload(protocol: str, url: str, model: str, inputs: Mapping[str, np.ndarray]) -> Payload:
    rows = _rows(inputs)
    if protocol == "eas-grpc":
        return Payload(encode_request(dict(inputs)), rows, EAS_GRPC_METHOD)
    if protocol == "kserve-grpc":
        return Payload(kserve_grpc_message(inputs, model), rows, KSERVE_GRPC_METHOD)
    if protocol == "tfserving-grpc":
        return Payload(encode_predict_request(inputs, model), rows, TFSERVING_GRPC_METHOD)
    if protocol == "eas-http":
        body, headers = encode_request(dict(inputs)), {"Content-Type": "application/octet-stream"}
    elif protocol == "kserve-http":
        body, headers = _kserve_http_body(inputs)
    else:
        body, headers = _tfserving_body(inputs), {"Content-Type": "application/json"}
    path = request_path(protocol, model)
    return Payload(_http_request(url, path, body, headers), rows, path=path, body=body, headers=headers)
