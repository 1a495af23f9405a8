"""TF Serving's REST predict API <-> numpy (``/v1/models/{name}:predict``).

Request: ``{"signature_name": ..., "instances": [...]}`` (row format: one entry per
sample, an object of named inputs or, for a one-input signature, the bare value) or
``{"inputs": {...}}`` (columnar: one batched value per input, or a bare value for a
one-input signature). Values are JSON numbers, booleans, strings or ``{"b64": ...}`` for
binary strings; their dtype is the signature's. Response: ``{"predictions": [...]}`` for
rows, ``{"outputs": ...}`` for columns, as TF Serving answers. Stateless, thread-safe.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.errors import RequestError

__all__ = ["PredictCall", "decode_predict", "encode_predict", "signature_def"]

_TF_DTYPE = {
    "float32": "DT_FLOAT", "float64": "DT_DOUBLE", "float16": "DT_HALF", "int8": "DT_INT8",
    "int16": "DT_INT16", "int32": "DT_INT32", "int64": "DT_INT64", "uint8": "DT_UINT8",
    "uint16": "DT_UINT16", "uint32": "DT_UINT32", "uint64": "DT_UINT64", "bool": "DT_BOOL",
    "string": "DT_STRING",
}


@dataclass(frozen=True)
class PredictCall:
    inputs: dict[str, np.ndarray]
    signature_name: str | None
    rows: bool  # True: "instances" in, "predictions" out


def _strings(value: Any, name: str) -> Any:
    """Nested JSON with str / {"b64": ...} leaves -> the same nesting with bytes leaves."""
    if isinstance(value, list):
        return [_strings(v, name) for v in value]
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, dict) and set(value) == {"b64"} and isinstance(value["b64"], str):
        try:
            return base64.b64decode(value["b64"], validate=True)
        except binascii.Error as exc:
            raise RequestError(f"input {name!r}: invalid base64 in {{\"b64\": ...}}: {exc}") from exc
    raise RequestError(f"input {name!r} expects strings, got {value!r:.60}")


def _array(name: str, value: Any, dtypes: Mapping[str, str]) -> np.ndarray:
    dtype = dtypes.get(name)
    try:
        if dtype == "string":
            converted = _strings(value, name)
            arr = np.empty(np.shape(converted), dtype=object)  # np.shape rejects ragged lists
            arr[...] = converted
            return arr
        if dtype is not None:
            return np.asarray(value, dtype=np.dtype(dtype))
        return np.asarray(value)
    except (TypeError, ValueError) as exc:
        raise RequestError(
            f"input {name!r}: cannot read the value as {dtype or 'an array'} ({exc}); "
            "nested lists must be rectangular") from exc


def _input_dtypes(signature: Mapping[str, Any]) -> dict[str, str]:
    dtypes: dict[str, str] = {}
    for alias, spec in signature["inputs"].items():
        dtypes[alias] = spec["dtype"]
        dtypes.setdefault(spec.get("name", alias), spec["dtype"])
        dtypes.setdefault(spec.get("name", alias) + ":0", spec["dtype"])
    return dtypes


def _only_input(signature: Mapping[str, Any], form: str) -> str:
    names = [str(name) for name in signature["inputs"]]
    if len(names) != 1:
        raise RequestError(
            f"{form} without input names needs a one-input signature; this one has inputs {sorted(names)}: "
            "send objects keyed by input name")
    return names[0]


def decode_predict(doc: Any, signature: Mapping[str, Any]) -> PredictCall:
    """`signature` is Processor.signature_info() of the signature the request names."""
    if not isinstance(doc, dict):
        raise RequestError('request must be a JSON object with "instances" or "inputs"')
    name = doc.get("signature_name")
    if name is not None and not isinstance(name, str):
        raise RequestError(f"signature_name must be a string, got {name!r:.60}")
    dtypes = _input_dtypes(signature)
    if ("instances" in doc) == ("inputs" in doc):
        raise RequestError('request must have exactly one of "instances" (rows) and "inputs" (columns)')
    if "instances" in doc:
        rows = doc["instances"]
        if not isinstance(rows, list) or not rows:
            raise RequestError('"instances" must be a non-empty list, one entry per sample')
        if all(isinstance(r, dict) and not set(r) <= {"b64"} for r in rows):
            keys = set(rows[0])
            for i, row in enumerate(rows):
                if set(row) != keys:
                    raise RequestError(
                        f"instance {i} has inputs {sorted(row)}, instance 0 has {sorted(keys)}; "
                        "every instance must name the same inputs")
            inputs = {k: _array(k, [row[k] for row in rows], dtypes) for k in rows[0]}
        else:
            only = _only_input(signature, '"instances"')
            inputs = {only: _array(only, rows, dtypes)}
        return PredictCall(inputs, name, rows=True)
    columns = doc["inputs"]
    if isinstance(columns, dict) and not set(columns) <= {"b64"}:
        inputs = {k: _array(k, v, dtypes) for k, v in columns.items()}
    else:
        only = _only_input(signature, '"inputs"')
        inputs = {only: _array(only, columns, dtypes)}
    return PredictCall(inputs, name, rows=False)


def _json(array: np.ndarray) -> Any:
    if array.dtype == object or array.dtype.kind in "SU":
        flat = [_json_string(v) for v in array.ravel()]
        return np.array(flat, dtype=object).reshape(array.shape).tolist() if array.ndim else flat[0]
    return array.tolist()


def _json_string(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return {"b64": base64.b64encode(value).decode()}
    return str(value)


def encode_predict(outputs: Mapping[str, np.ndarray], rows: bool) -> dict[str, Any]:
    if not rows:
        if len(outputs) == 1:
            return {"outputs": _json(next(iter(outputs.values())))}
        return {"outputs": {k: _json(v) for k, v in outputs.items()}}
    batches = {k: (v.shape[0] if v.ndim else None) for k, v in outputs.items()}
    sizes = set(batches.values())
    if len(sizes) != 1 or None in sizes:
        raise RequestError(
            f"outputs {batches} do not share a batch dimension, so they cannot be returned as rows; "
            'send "inputs" (columnar) instead of "instances"')
    if len(outputs) == 1:
        return {"predictions": _json(next(iter(outputs.values())))}
    columns = {k: _json(v) for k, v in outputs.items()}
    return {"predictions": [{k: col[i] for k, col in columns.items()} for i in range(sizes.pop() or 0)]}


def _tensor_info(spec: Mapping[str, Any], alias: str) -> dict[str, Any]:
    return {
        "dtype": _TF_DTYPE.get(spec["dtype"], "DT_INVALID"),
        "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in spec["shape"]], "unknown_rank": False},
        "name": spec.get("name", alias),
    }


def signature_def(signature: Mapping[str, Any]) -> dict[str, Any]:
    """TF Serving's SignatureDef JSON for Processor.signature_info()."""
    return {
        "inputs": {a: _tensor_info(s, a) for a, s in signature["inputs"].items()},
        "outputs": {a: _tensor_info(s, a) for a, s in signature["outputs"].items()},
        "method_name": "tensorflow/serving/predict",
    }
