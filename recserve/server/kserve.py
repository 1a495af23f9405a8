"""KServe v2 (Open Inference Protocol) tensors <-> numpy, for HTTP/JSON with the binary
data extension and for gRPC with raw contents.

HTTP: the body is JSON, or JSON followed by raw tensor bytes when the
``Inference-Header-Content-Length`` header gives the JSON's length; an input with
``parameters.binary_data_size`` takes its values from the raw part, in input order. An
output travels as raw bytes when its ``parameters.binary_data`` (or the request's
``parameters.binary_data_output``) is true. BYTES elements travel raw as a 4-byte
little-endian length then the bytes. The HTTP request's decoding and the per-tensor
conversions are recserve.wire.kserve_json's (no protobuf there). Stateless, thread-safe.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from recserve.errors import RequestError
from recserve.proto import grpc_predict_v2_pb2 as v2
from recserve.wire.kserve_datatypes import DATATYPE_NUMPY, datatype_of
from recserve.wire.kserve_json import InferCall, array_from_raw, array_from_values, decode_http_request, numpy_dtype

__all__ = [
    "HEADER_LENGTH",
    "InferCall",
    "decode_grpc_request",
    "decode_http_request",
    "encode_grpc_response",
    "encode_http_response",
    "tensor_metadata",
]

HEADER_LENGTH = "inference-header-content-length"

_NUMPY = DATATYPE_NUMPY
# signature_info dtype names (numpy's, "string" for strings) -> v2 datatypes
_FROM_SIGNATURE = {str(dtype): name for name, dtype in _NUMPY.items() if name != "BYTES"} | {"string": "BYTES"}
# gRPC InferTensorContents field per datatype
_CONTENTS = {
    "BOOL": "bool_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "INT8": "int_contents",
    "INT16": "int_contents", "INT32": "int_contents", "INT64": "int64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}


def tensor_metadata(signature_tensors: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """[{name, datatype, shape}] from signature_info()'s inputs or outputs."""
    return [
        {"name": alias, "datatype": _FROM_SIGNATURE.get(t["dtype"], t["dtype"].upper()),
         "shape": [int(d) for d in t["shape"]]}
        for alias, t in signature_tensors.items()
    ]


def _join_bytes(values: np.ndarray) -> bytes:
    parts = []
    for v in values.ravel():
        b = v if isinstance(v, bytes) else str(v).encode()
        parts.append(struct.pack("<I", len(b)))
        parts.append(b)
    return b"".join(parts)


# json.dumps(doc, separators=(",", ":")) makes a new encoder per call when given any option:
# one made once writes the same bytes.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))


def _json_values(array: np.ndarray) -> list[Any]:
    flat = array.ravel()
    if flat.dtype == object or flat.dtype.kind in "SU":
        return [v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in flat]
    return flat.tolist()


def encode_http_response(
    model: str, version: str, call: InferCall, outputs: Mapping[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """(body, JSON header length when raw bytes follow it, else None)."""
    specs = []
    raw_parts: list[bytes] = []
    for name, array in outputs.items():
        datatype = datatype_of(array)
        spec: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if call.binary_outputs.get(name, call.binary_default):
            raw = _join_bytes(array) if datatype == "BYTES" else np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes()
            spec["parameters"] = {"binary_data_size": len(raw)}
            raw_parts.append(raw)
        else:
            spec["data"] = _json_values(array)
        specs.append(spec)
    doc: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": specs}
    if call.id:
        doc["id"] = call.id
    head = _COMPACT_JSON.encode(doc).encode()
    if not raw_parts:
        return head, None
    return head + b"".join(raw_parts), len(head)


def _grpc_param(params: Any, key: str) -> str | None:
    if key in params and params[key].WhichOneof("parameter_choice") == "string_param":
        return str(params[key].string_param)
    return None


def decode_grpc_request(request: v2.ModelInferRequest) -> InferCall:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise RequestError(f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs")
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(request.inputs):
        shape = tuple(tensor.shape)
        if any(d < 0 for d in shape):
            raise RequestError(f"input {tensor.name!r}: shape {list(shape)} has a negative dimension")
        if raw:
            inputs[tensor.name] = array_from_raw(tensor.name, tensor.datatype, shape, raw[i])
        else:
            field = _CONTENTS.get(tensor.datatype)
            if field is None:
                numpy_dtype(tensor.name, tensor.datatype)
                raise RequestError(f"input {tensor.name!r}: {tensor.datatype} needs raw_input_contents")
            inputs[tensor.name] = array_from_values(tensor.name, tensor.datatype, shape,
                                               list(getattr(tensor.contents, field)))
    outputs = [o.name for o in request.outputs] or None
    return InferCall(inputs=inputs, outputs=outputs, binary_outputs={}, binary_default=True,
                     id=request.id, version=request.model_version,
                     signature_name=_grpc_param(request.parameters, "signature_name"))


def encode_grpc_response(
    model: str, version: str, call: InferCall, outputs: Mapping[str, np.ndarray]
) -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(model_name=model, model_version=version, id=call.id)
    for name, array in outputs.items():
        datatype = datatype_of(array)
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        response.raw_output_contents.append(
            _join_bytes(array) if datatype == "BYTES"
            else np.ascontiguousarray(array, array.dtype.newbyteorder("<")).tobytes())
    return response

