"""KServe v2 (Open Inference Protocol) requests from their HTTP/JSON form to numpy: the JSON
head, and the raw tensor bytes after it when the ``Inference-Header-Content-Length`` header
gives the head's length (an input with ``parameters.binary_data_size`` takes its values from
the raw part, in input order; BYTES elements travel raw as a 4-byte little-endian length then
the bytes). Also the per-tensor conversions the gRPC form shares (recserve.server.kserve).
No protobuf here: test processes that load tritonclient.grpc (which registers the same
`inference.*` messages) can import it. Stateless, thread-safe.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from recserve.errors import RequestError
from recserve.wire.kserve_datatypes import DATATYPE_NUMPY

__all__ = ["InferCall", "array_from_raw", "array_from_values", "decode_http_request", "numpy_dtype"]

_NUMPY = DATATYPE_NUMPY
_NAMES = ", ".join(_NUMPY)


@dataclass(frozen=True)
class InferCall:
    """A decoded inference request."""

    inputs: dict[str, np.ndarray]
    outputs: list[str] | None          # None: every output of the signature
    binary_outputs: Mapping[str, bool]  # HTTP: outputs whose parameters.binary_data is given
    binary_default: bool                # HTTP: raw bytes for the other outputs
    id: str
    version: str
    signature_name: str | None



def numpy_dtype(name: str, datatype: str) -> np.dtype[Any]:
    dtype = _NUMPY.get(datatype)
    if dtype is None:
        raise RequestError(f"input {name!r}: datatype {datatype!r} is not supported; supported: {_NAMES}")
    return dtype


def _shape(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, list):
        for d in shape:  # a loop, not all(<generator>): this runs for every input of every request
            if type(d) is not int or d < 0:  # not isinstance: numpy takes no bool for a dimension
                break
        else:
            return tuple(shape)
    raise RequestError(f"input {name!r}: shape must be a list of integers >= 0, got {shape!r}")


def _split_bytes(name: str, raw: bytes | memoryview, count: int) -> np.ndarray:
    """BYTES raw layout -> object array of `count` bytes values."""
    out = np.empty(count, dtype=object)
    view = memoryview(raw)
    pos = 0
    for i in range(count):
        if pos + 4 > len(view):
            raise RequestError(f"input {name!r}: BYTES data ends after {i} of {count} elements")
        (length,) = struct.unpack_from("<I", view, pos)
        pos += 4
        if pos + length > len(view):
            raise RequestError(f"input {name!r}: BYTES element {i} is cut short")
        out[i] = bytes(view[pos:pos + length])
        pos += length
    if pos != len(view):
        raise RequestError(f"input {name!r}: {len(view) - pos} bytes left after {count} BYTES elements")
    return out




def array_from_raw(name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview) -> np.ndarray:
    dtype = numpy_dtype(name, datatype)
    count = math.prod(shape)
    if datatype == "BYTES":
        return _split_bytes(name, raw, count).reshape(shape)
    if len(raw) != count * dtype.itemsize:
        raise RequestError(
            f"input {name!r}: shape {list(shape)} of {datatype} needs {count * dtype.itemsize} bytes, "
            f"got {len(raw)}")
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)


def array_from_values(name: str, datatype: str, shape: tuple[int, ...], values: Any) -> np.ndarray:
    dtype = numpy_dtype(name, datatype)
    if datatype == "BYTES":
        flat = np.array(values, dtype=object).ravel()
        flat = np.array([v.encode() if isinstance(v, str) else v for v in flat] or [], dtype=object)
        arr = flat
    else:
        try:
            arr = np.asarray(values, dtype=dtype).ravel()
        except (TypeError, ValueError) as exc:
            raise RequestError(f"input {name!r}: data is not a list of {datatype} values: {exc}") from exc
    if arr.size != math.prod(shape):
        raise RequestError(f"input {name!r}: shape {list(shape)} needs {math.prod(shape)} values, got {arr.size}")
    return arr.reshape(shape)


def _param(params: Any, key: str) -> Any:
    return params.get(key) if isinstance(params, dict) else None


# An input of these datatypes whose JSON data is a flat list of its shape's count is converted
# together with the request's other such inputs of its datatype (_ListedInputs).
_GROUPED = frozenset(name for name in _NUMPY if name != "BYTES")


class _ListedInputs:
    """The JSON-data inputs of one request, converted to numpy one datatype at a time: one
    np.array over every listed value of a datatype, then a view per input. A batch-1 request
    of a recommendation model has tens of one-element inputs, and converting each on its own
    cost more than the model's run (27 inputs: ~26 us against ~4 us grouped). Any input whose
    values do not convert so (nested lists, a value of the wrong kind, a count that does not
    fit) is converted on its own, which raises its own error as it always did."""

    __slots__ = ("groups",)

    def __init__(self) -> None:
        # datatype -> (name, shape, data) of its inputs, in request order
        self.groups: dict[str, list[tuple[str, tuple[int, ...], list[Any]]]] = {}

    def add(self, name: str, datatype: str, shape: tuple[int, ...], data: list[Any]) -> None:
        try:
            self.groups[datatype].append((name, shape, data))
        except KeyError:
            self.groups[datatype] = [(name, shape, data)]

    def convert(self, inputs: dict[str, np.ndarray | None]) -> None:
        """Fill the inputs `add` named (their places in `inputs` already taken, in request order)."""
        for datatype, group in self.groups.items():
            if len(group) == 1:
                name, shape, data = group[0]
                inputs[name] = array_from_values(name, datatype, shape, data)
                continue
            values: list[Any] = []
            for _, _, data in group:
                values += data
            try:
                flat = np.array(values, dtype=_NUMPY[datatype])
            except (TypeError, ValueError, OverflowError):
                flat = None
            if flat is None or flat.ndim != 1:  # an input's values are not plain numbers: each its own way
                for name, shape, data in group:
                    inputs[name] = array_from_values(name, datatype, shape, data)
                continue
            start = 0
            for name, shape, data in group:
                end = start + len(data)
                part = flat[start:end]
                inputs[name] = part if len(shape) == 1 else part.reshape(shape)  # a slice is 1-D already
                start = end
        self.groups.clear()


def _decode_input(spec: Any, inputs: dict[str, Any], listed: _ListedInputs, raw: memoryview, offset: int) -> int:
    """One input of a JSON body into `inputs` (or `listed`, to convert with others of its
    datatype); returns the offset of the next binary input in `raw`."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise RequestError('each input needs "name", "shape", "datatype" and "data" (or binary_data_size)')
    name = spec["name"]
    shape = _shape(name, spec.get("shape"))
    datatype = spec.get("datatype")
    if not isinstance(datatype, str):
        raise RequestError(f"input {name!r}: datatype is missing; supported: {_NAMES}")
    if name in inputs:  # a name given twice: the last one wins, as it always did
        listed.convert(inputs)
    size = _param(spec.get("parameters"), "binary_data_size")
    if size is not None:
        if not isinstance(size, int) or size < 0 or offset + size > len(raw):
            raise RequestError(
                f"input {name!r}: binary_data_size {size!r} exceeds the {len(raw) - offset} binary bytes left")
        inputs[name] = array_from_raw(name, datatype, shape, raw[offset:offset + size])
        return offset + size
    if "data" not in spec:
        raise RequestError(f"input {name!r} has neither data nor parameters.binary_data_size")
    data = spec["data"]
    if datatype in _GROUPED and isinstance(data, list) and len(data) == math.prod(shape):
        inputs[name] = None  # its place, in request order; filled by listed.convert
        listed.add(name, datatype, shape, data)
    else:
        inputs[name] = array_from_values(name, datatype, shape, data)
    return offset


def decode_http_request(body: bytes, header_length: int | None, version: str = "") -> InferCall:
    if header_length is not None and not 0 <= header_length <= len(body):
        raise RequestError(
            f"Inference-Header-Content-Length {header_length} is outside the body of {len(body)} bytes")
    head = body if header_length is None else body[:header_length]
    raw = memoryview(body)[len(head):]
    try:
        # orjson: ~6x json's speed on a batch-64 body (350 -> 60 us); strict JSON (no NaN
        # literals, integers within 64 bits), nesting bounded (1024).
        doc = orjson.loads(head)
    except orjson.JSONDecodeError as exc:
        raise RequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list):
        raise RequestError('request must be a JSON object with an "inputs" list')
    inputs: dict[str, Any] = {}
    listed = _ListedInputs()
    groups = listed.groups
    offset = 0
    for spec in doc["inputs"]:
        # The usual input, checked with the fewest steps (they run for every input of every
        # request): exactly name, shape, datatype and data, the data a list of the shape's
        # count of a numeric datatype, the shape one or two plain integers. Any other goes
        # through _decode_input's checks, which name what is wrong.
        if type(spec) is dict and len(spec) == 4:
            name, shape, datatype, data = spec.get("name"), spec.get("shape"), spec.get("datatype"), spec.get("data")
            if type(name) is str and type(data) is list and type(shape) is list and name not in inputs:
                rank = len(shape)
                if rank == 1:
                    ok = type(shape[0]) is int and shape[0] == len(data)
                elif rank == 2:
                    rows, cols = shape
                    ok = type(rows) is int and type(cols) is int and rows >= 0 and cols >= 0 and rows * cols == len(data)
                else:
                    ok = False
                if ok and datatype in _GROUPED:
                    inputs[name] = None  # its place, in request order; filled by listed.convert
                    try:
                        groups[datatype].append((name, tuple(shape), data))
                    except KeyError:
                        groups[datatype] = [(name, tuple(shape), data)]
                    continue
        offset = _decode_input(spec, inputs, listed, raw, offset)
    if offset != len(raw):
        raise RequestError(f"{len(raw) - offset} binary bytes after the last input's binary_data_size")
    listed.convert(inputs)
    outputs = None
    binary: dict[str, bool] = {}
    if isinstance(doc.get("outputs"), list):
        outputs = []
        for spec in doc["outputs"]:
            if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
                raise RequestError('each requested output needs a "name"')
            outputs.append(spec["name"])
            choice = _param(spec.get("parameters"), "binary_data")
            if choice is not None:
                binary[spec["name"]] = bool(choice)
    params = doc.get("parameters")
    signature = _param(params, "signature_name")
    return InferCall(
        inputs=inputs, outputs=outputs, binary_outputs=binary,
        binary_default=bool(_param(params, "binary_data_output")),
        id=str(doc.get("id", "")), version=version,
        signature_name=signature if isinstance(signature, str) else None,
    )


