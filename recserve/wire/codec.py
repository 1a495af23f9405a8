"""The wire format (DESIGN §3) <-> numpy: PredictRequest/PredictResponse/ServingModelInfo.

Decoding is native (`_codec_native`: one C parse of the whole request, any field order,
packed or not) unless ``RECSERVE_PURE_PYTHON=1`` is set when this module is imported or
the C side declines a request; the message path below then decides. Without the native
decoder, decoding takes one of two pure-Python paths with identical results:

* the canonical path, for requests laid out the way protobuf encoders write them (fields
  in number order, packed values, each input's values in one chunk). One upb parse of a
  *flattened view* of the bytes (`_FlatRequest`: the same field numbers, but the map
  entries of all inputs merged into one message, so every key, dtype, shape and value
  chunk arrives in a single list instead of one Python wrapper per input) replaces ~1 µs
  of attribute access per input. Float/double chunks become arrays with
  `np.frombuffer` (zero copy); varint chunks of all inputs of one kind are decoded in
  one more upb parse. Which chunk belongs to which input is then *proved*, not assumed:
  the canonical encoding is rebuilt from the pieces and must equal the request bytes.
* the message path for everything else (unpacked values from old clients, fields out of
  order, unknown fields, malformed requests): the real `PredictRequest` parse and one
  `np.array(repeated_field)` per input. It owns every error message, so both paths
  reject a bad request with the same text.

Arrays returned by `decode_request` may be read-only views of the request bytes.
Module functions are thread-safe (the plan and header caches are plain dicts whose
races only cost a recomputation).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message, message_factory

from recserve.errors import InternalError, RequestError
from recserve.proto import predict_pb2 as pb

if TYPE_CHECKING:
    from recserve.wire._codec_native import ParsedRequest

_NativeDecode = Callable[[bytes], "tuple[str, dict[str, np.ndarray], tuple[str, ...]] | None"]
_NativeParse = Callable[[bytes], "ParsedRequest | None"]


def _native_codec() -> tuple[_NativeDecode, _NativeParse] | tuple[None, None]:
    if os.environ.get("RECSERVE_PURE_PYTHON") == "1":
        return None, None
    from recserve.wire._codec_native import decode, parse
    return decode, parse


_native, _native_parse = _native_codec()

__all__ = [
    "DecodedRequest",
    "decode_model_info",
    "decode_request",
    "decode_response",
    "encode_model_info",
    "encode_request",
    "encode_response",
    "parse_request",
]


@dataclass(frozen=True)
class DecodedRequest:
    """A decoded PredictRequest. Immutable (its arrays may be read-only); share freely."""

    signature_name: str
    inputs: dict[str, np.ndarray]
    output_filter: tuple[str, ...]


# --- dtypes ----------------------------------------------------------------------------

_FLOAT, _DOUBLE, _INT, _STRING, _INT64, _BOOL = 3, 4, 5, 6, 7, 8  # ArrayProto field numbers
_VALUE_FIELD_NAME = {_FLOAT: "float_val", _DOUBLE: "double_val", _INT: "int_val",
                     _STRING: "string_val", _INT64: "int64_val", _BOOL: "bool_val"}


@dataclass(frozen=True)
class _Kind:
    """How one ArrayDataType travels: its value field, numpy dtype, wire values per element.
    Immutable."""

    field: int
    numpy: np.dtype[Any]
    per_element: int = 1    # complex values travel as (real, imag) pairs


# TF's conventions, as DeepRec's processor reads them (util.cc Proto2Tensor): narrow ints
# in int_val, half in float_val, complex as pairs.
_KINDS: dict[int, _Kind] = {
    pb.DT_FLOAT: _Kind(_FLOAT, np.dtype(np.float32)),
    pb.DT_DOUBLE: _Kind(_DOUBLE, np.dtype(np.float64)),
    pb.DT_HALF: _Kind(_FLOAT, np.dtype(np.float16)),
    pb.DT_COMPLEX64: _Kind(_FLOAT, np.dtype(np.complex64), 2),
    pb.DT_COMPLEX128: _Kind(_DOUBLE, np.dtype(np.complex128), 2),
    pb.DT_INT8: _Kind(_INT, np.dtype(np.int8)),
    pb.DT_INT16: _Kind(_INT, np.dtype(np.int16)),
    pb.DT_INT32: _Kind(_INT, np.dtype(np.int32)),
    pb.DT_UINT8: _Kind(_INT, np.dtype(np.uint8)),
    pb.DT_UINT16: _Kind(_INT, np.dtype(np.uint16)),
    pb.DT_INT64: _Kind(_INT64, np.dtype(np.int64)),
    pb.DT_BOOL: _Kind(_BOOL, np.dtype(np.bool_)),
    pb.DT_STRING: _Kind(_STRING, np.dtype(object)),
}
_SUPPORTED = ", ".join(pb.ArrayDataType.Name(d) for d in sorted(_KINDS))
_DTYPE_OF_NUMPY = {k.numpy: d for d, k in _KINDS.items() if d != pb.DT_STRING}
_FIXED_WIDTH = {_FLOAT: 4, _DOUBLE: 8}
# The numpy dtype each value field decodes to before conversion to the array's dtype.
_WIRE_DTYPE = {_FLOAT: np.dtype(np.float32), _DOUBLE: np.dtype(np.float64), _INT: np.dtype(np.int32),
               _INT64: np.dtype(np.int64), _BOOL: np.dtype(np.bool_)}
_WIRE_NUMPY = {_FLOAT: np.dtype("<f4"), _DOUBLE: np.dtype("<f8")}


def _dtype_error(name: str, dtype: int) -> RequestError:
    if dtype == pb.DT_INVALID:
        what = "dtype is not set (DT_INVALID)"
    elif dtype in pb.ArrayDataType.values():
        what = f"dtype {pb.ArrayDataType.Name(dtype)} is not supported"
    else:
        what = f"unknown dtype {dtype}"
    return RequestError(f"input '{name}': {what}; supported: {_SUPPORTED}")


def _count_error(name: str, dims: Sequence[int], kind: _Kind, got: int) -> RequestError:
    need = math.prod(dims)
    if kind.per_element == 1:
        return RequestError(f"input '{name}': shape {list(dims)} needs {need} values, got {got}")
    return RequestError(
        f"input '{name}': shape {list(dims)} needs {need * 2} values "
        f"({need} complex numbers as real, imag pairs), got {got}")


def _check_dims(name: str, dims: Sequence[int]) -> None:
    if any(d < 0 for d in dims):
        raise RequestError(f"input '{name}': shape {list(dims)} has a negative dimension; "
                           "dimensions must be >= 0")


# An empty shape's other dimensions are bounded too: numpy cannot make e.g. [2**62, 2, 0].
# No request can carry more values than this (the C ABI counts its bytes in an int).
_MAX_ELEMENTS = 2**31 - 1


def _empty_shape_too_large(dims: Sequence[int]) -> bool:
    return 0 in dims and math.prod(d for d in dims if d) > _MAX_ELEMENTS


def _check_empty_shape(name: str, dims: Sequence[int]) -> None:
    if _empty_shape_too_large(dims):
        raise RequestError(f"input '{name}': shape {list(dims)} is too large: its non-zero "
                           f"dimensions multiply to more than {_MAX_ELEMENTS}")


def _from_wire(name: str, dtype: int, values: np.ndarray) -> np.ndarray:
    """Flat wire values (float32/float64/int32/int64/bool) -> the flat array of `dtype`."""
    kind = _KINDS[dtype]
    if kind.per_element == 2:
        return np.ascontiguousarray(values).view(kind.numpy)
    if kind.field == _INT and kind.numpy != np.int32 and values.size:
        info = np.iinfo(kind.numpy)
        low, high = int(values.min()), int(values.max())
        if low < info.min or high > info.max:
            bad = low if low < info.min else high
            raise RequestError(
                f"input '{name}': value {bad} is out of range for "
                f"{pb.ArrayDataType.Name(dtype)} [{info.min}, {info.max}]")
    if values.dtype != kind.numpy:
        return values.astype(kind.numpy)
    return values


# --- decoding: the message path ----------------------------------------------------------

def _array_from_proto(name: str, proto: Any) -> np.ndarray:
    dtype = proto.dtype
    kind = _KINDS.get(dtype)
    if kind is None:
        raise _dtype_error(name, dtype)
    dims = tuple(proto.array_shape.dim)
    _check_dims(name, dims)
    values = getattr(proto, _VALUE_FIELD_NAME[kind.field])
    need = math.prod(dims) * kind.per_element
    if len(values) != need:
        raise _count_error(name, dims, kind, len(values))
    _check_empty_shape(name, dims)
    if kind.field == _STRING:
        strings = np.empty(need, dtype=object)
        strings[:] = list(values)
        return strings.reshape(dims)
    wire = _WIRE_DTYPE[kind.field]
    # upb's __array__ copies the storage in one go but costs ~3 µs to set up.
    flat = np.fromiter(values, wire, need) if need <= 64 else np.array(values, dtype=wire)
    return _from_wire(name, dtype, flat).reshape(dims)


def _decode_message(data: bytes) -> DecodedRequest:
    try:
        request = pb.PredictRequest.FromString(data)
    except message.DecodeError as exc:
        raise RequestError(
            f"request is not a valid tensorflow.eas.PredictRequest ({len(data)} bytes): {exc}"
        ) from exc
    inputs = {name: _array_from_proto(name, proto) for name, proto in request.inputs.items()}
    return DecodedRequest(request.signature_name, inputs, tuple(request.output_filter))


# --- decoding: the canonical path ----------------------------------------------------------

def _view_messages() -> dict[str, type[message.Message]]:
    """Flattened views of predict.proto, same field numbers, built at import (no .proto file:
    they are an implementation detail of this module, not a wire contract)."""
    t = descriptor_pb2.FieldDescriptorProto
    rep, opt = t.LABEL_REPEATED, t.LABEL_OPTIONAL
    layout: dict[str, list[tuple[str, int, int, int, str]]] = {
        # Every input's ArrayProto merged into one: each field collects all inputs' pieces.
        "FlatArrays": [
            ("dtype", 1, rep, t.TYPE_INT32, ""),
            ("array_shape", 2, rep, t.TYPE_BYTES, ""),
            *((_VALUE_FIELD_NAME[f], f, rep, t.TYPE_BYTES, "") for f in (3, 4, 5, 6, 7, 8)),
        ],
        # Every map entry merged into one (a singular message field merges on repeat).
        "FlatEntries": [("key", 1, rep, t.TYPE_STRING, ""),
                        ("value", 2, opt, t.TYPE_MESSAGE, ".recserve.view.FlatArrays")],
        "FlatRequest": [("signature_name", 1, opt, t.TYPE_STRING, ""),
                        ("inputs", 2, opt, t.TYPE_MESSAGE, ".recserve.view.FlatEntries"),
                        ("output_filter", 3, rep, t.TYPE_STRING, "")],
        "Int64s": [("v", 1, rep, t.TYPE_INT64, "")],
        "Int32s": [("v", 1, rep, t.TYPE_INT32, "")],
        "Bools": [("v", 1, rep, t.TYPE_BOOL, "")],
    }
    file = descriptor_pb2.FileDescriptorProto(
        name="recserve/processor/codec_view.proto", package="recserve.view", syntax="proto3")
    for name, fields in layout.items():
        msg = file.message_type.add(name=name)
        for fname, number, label, ftype, type_name in fields:
            field = msg.field.add(name=fname, number=number, label=label, type=ftype)
            if type_name:
                field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"recserve.view.{name}"))
            for name in layout}


_VIEW = _view_messages()
_FlatRequest = _VIEW["FlatRequest"]
_VARINT_VIEW = {_INT64: (_VIEW["Int64s"], np.int64), _INT: (_VIEW["Int32s"], np.int32),
                _BOOL: (_VIEW["Bools"], np.bool_)}
_CONTINUATION_BYTES = bytes(range(0x80, 0x100))   # deleted to count varints (one end byte each)

_CACHE_LIMIT = 8192


@dataclass(frozen=True, slots=True, eq=False)   # eq=False: `in` checks are identity checks
class _Plan:
    """What one (dtype, raw shape) pair means on the canonical path. Immutable."""

    dtype: int
    field: int
    dims: tuple[int, ...]
    count: int          # wire values (complex: 2 per element)
    chunk_bytes: int    # exact chunk length for fixed-width fields; 0 for varint fields
    convert: bool       # the wire dtype is not the array's dtype (narrow ints, half, complex)


_plans: dict[tuple[int, bytes], _Plan | None] = {}
_headers: dict[tuple[str, int, bytes, int], bytes] = {}


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> Any:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


def _plan(dtype: int, shape: bytes) -> _Plan | None:
    """None for what the canonical path leaves to the message path: strings, unsupported
    dtypes, negative dims, a non-canonical ArrayShape."""
    kind = _KINDS.get(dtype)
    if kind is None or kind.field == _STRING:
        return _remember(_plans, (dtype, shape), None)
    try:
        dims = tuple(pb.ArrayShape.FromString(shape).dim)
    except message.DecodeError:
        return _remember(_plans, (dtype, shape), None)
    if (any(d < 0 for d in dims) or _empty_shape_too_large(dims)
            or pb.ArrayShape(dim=dims).SerializeToString() != shape):
        return _remember(_plans, (dtype, shape), None)
    count = math.prod(dims) * kind.per_element
    plan = _Plan(dtype, kind.field, dims, count, count * _FIXED_WIDTH.get(kind.field, 0),
                 kind.numpy != _WIRE_DTYPE[kind.field])
    return _remember(_plans, (dtype, shape), plan)


def _entry_header(header_key: tuple[str, int, bytes, int], field: int) -> bytes:
    """Canonical bytes of one `inputs` map entry (field 2 of PredictRequest) up to its values;
    `header_key` is (input name, dtype, raw shape, value chunk length)."""
    key, dtype, shape, chunk_len = header_key
    value_head = b"\x08" + _varint(dtype) + _field(0x12, shape)
    if chunk_len:
        value_head += bytes((field << 3 | 2,)) + _varint(chunk_len)
    entry_head = _field(0x0A, key.encode()) + b"\x12" + _varint(len(value_head) + chunk_len) + value_head
    header = b"\x12" + _varint(len(entry_head) + chunk_len) + entry_head
    return _remember(_headers, header_key, header)


def _decode_canonical(data: bytes) -> DecodedRequest | None:
    """Decode a canonically encoded request; None when `data` is anything else.

    Written as whole-list operations (comprehensions, zip) rather than one loop body per
    input: at batch 1 the per-input interpreter overhead is the cost that matters.
    """
    try:
        view = _FlatRequest.FromString(data)
    except message.DecodeError:
        return None
    entries = view.inputs
    arrays = entries.value
    keys = list(entries.key)
    dtypes = list(arrays.dtype)
    shapes = list(arrays.array_shape)
    if not (len(dtypes) == len(shapes) == len(keys)):
        return None
    plans = [_plans.get(pair, False) for pair in zip(dtypes, shapes)]
    if False in plans:
        plans = [_plan(*pair) if plan is False else plan
                 for pair, plan in zip(zip(dtypes, shapes), plans)]
    if None in plans:
        return None
    chunk_lists: dict[int, list[bytes]] = {}
    fields = [plan.field for plan in plans]
    for field in set(fields):
        field_plans = [plan for plan, f in zip(plans, fields) if f == field and plan.count]
        chunks = list(getattr(arrays, _VALUE_FIELD_NAME[field]))
        if field in _FIXED_WIDTH:
            if list(map(len, chunks)) != [p.chunk_bytes for p in field_plans]:
                return None
        # A varint ends in its only byte below 0x80: count those.
        elif [len(c.translate(None, _CONTINUATION_BYTES)) for c in chunks] != [p.count for p in field_plans]:
            return None
        chunk_lists[field] = chunks
    # Each input's value chunk, in input order (b"" for inputs without values).
    values = next(iter(chunk_lists.values())) if len(chunk_lists) == 1 else []
    if len(values) != len(plans):
        next_chunk = {field: iter(chunks).__next__ for field, chunks in chunk_lists.items()}
        values = [next_chunk[p.field]() if p.count else b"" for p in plans]
    header_keys = list(zip(keys, dtypes, shapes, map(len, values)))
    headers = [_headers.get(hk) for hk in header_keys]
    if None in headers:
        headers = [h or _entry_header(hk, p.field) for h, hk, p in zip(headers, header_keys, plans)]
    parts = [b""] * (2 * len(keys))
    parts[0::2] = headers
    parts[1::2] = values
    head = _field(0x0A, view.signature_name.encode()) if view.signature_name else b""
    tail = b"".join(_field(0x1A, name.encode()) for name in view.output_filter)
    if head + b"".join(parts) + tail != data:
        return None
    # `data` is now proven to be exactly the canonical encoding of (keys, plans, values).
    inputs: dict[str, np.ndarray] = {}
    for field in chunk_lists:
        group = [(k, p, v) for k, p, v, f in zip(keys, plans, values, fields) if f == field]
        decoded = _group_values(field, group)
        if decoded is None:
            return None
        inputs.update(decoded)
    return DecodedRequest(view.signature_name, inputs, tuple(view.output_filter))


def _group_values(field: int, group: list[tuple[str, _Plan, bytes]]) -> dict[str, np.ndarray] | None:
    """Arrays of every input whose values travel in `field`."""
    if field in _WIRE_NUMPY:
        wire = _WIRE_NUMPY[field]
        return {key: _shaped(key, plan, np.frombuffer(chunk, dtype=wire)) for key, plan, chunk in group}
    view_type, wire_dtype = _VARINT_VIEW[field]
    payload = b"".join(chunk for *_, chunk in group)
    try:
        values = view_type.FromString(_field(0x0A, payload)).v
    except message.DecodeError:
        return None
    # upb's __array__ copies the storage in one go but costs ~3 µs to set up.
    flat = np.fromiter(values, wire_dtype, len(values)) if len(values) <= 64 else np.array(values, dtype=wire_dtype)
    first = group[0][1]
    if all(plan is first for _, plan, _ in group) and not first.convert:
        # The common case (every id input shaped alike): one reshape, one view per row.
        rows = flat.reshape((len(group), *first.dims))
        return dict(zip([key for key, _, _ in group], list(rows)))
    out, offset = {}, 0
    for key, plan, _chunk in group:
        out[key] = _shaped(key, plan, flat[offset:offset + plan.count])
        offset += plan.count
    return out


def _shaped(key: str, plan: _Plan, flat: np.ndarray) -> np.ndarray:
    return (_from_wire(key, plan.dtype, flat) if plan.convert else flat).reshape(plan.dims)


# Above this size the message path is faster: the per-input overhead the canonical path
# saves no longer dominates, and counting varints (bytes.translate) grows with the bytes.
# Measured crossover: between batch 64 (19 KB, canonical 2x faster) and batch 512 (147 KB,
# message path 2x faster) for a 27-input request.
_CANONICAL_PATH_MAX_BYTES = 32 * 1024


def _decode_python(data: bytes) -> DecodedRequest:
    if len(data) <= _CANONICAL_PATH_MAX_BYTES:
        decoded = _decode_canonical(data)
        if decoded is not None:
            return decoded
    return _decode_message(data)


def decode_request(data: bytes) -> DecodedRequest:
    """PredictRequest bytes -> arrays. Raises RequestError (400) naming what is wrong."""
    if _native is None:
        return _decode_python(data)
    decoded = _native(data if type(data) is bytes else bytes(data))
    return _decode_message(data) if decoded is None else DecodedRequest(*decoded)


def parse_request(data: bytes) -> ParsedRequest | None:
    """The native parser's raw result (one int64 values buffer and its layout's recipe) for
    callers that feed the values on without building arrays; None when the native codec is
    off or declines the bytes: then `decode_request` (which owns every error message)."""
    if _native is None or _native_parse is None:
        return None
    return _native_parse(data if type(data) is bytes else bytes(data))


def decode_response(data: bytes) -> dict[str, np.ndarray]:
    """PredictResponse bytes -> {output name: array} (for clients and tests)."""
    try:
        response = pb.PredictResponse.FromString(data)
    except message.DecodeError as exc:
        raise RequestError(f"not a valid tensorflow.eas.PredictResponse: {exc}") from exc
    return {name: _array_from_proto(name, proto) for name, proto in response.outputs.items()}


# --- encoding ----------------------------------------------------------------------------

_SUPPORTED_NUMPY = ", ".join(sorted({str(k.numpy) for k in _KINDS.values()} - {"object"}))


def _encode_array(role: str, name: str, value: np.ndarray | Sequence[Any],
                  error: type[Exception]) -> bytes:
    """One ArrayProto, canonical (fields in number order, values packed)."""
    arr = np.asarray(value)
    if arr.dtype.kind in "OSU":
        dtype = pb.DT_STRING
    else:
        dtype = _DTYPE_OF_NUMPY.get(arr.dtype) or _DTYPE_OF_NUMPY.get(arr.dtype.newbyteorder("="), pb.DT_INVALID)
        if dtype == pb.DT_INVALID:
            raise error(f"{role} '{name}': numpy dtype {arr.dtype} cannot be sent; supported: "
                        f"{_SUPPORTED_NUMPY}, and str/bytes (DT_STRING)")
    kind = _KINDS[dtype]
    flat = arr.reshape(-1)
    if kind.field in _WIRE_NUMPY:
        # Written directly: packed float/double values are the array's little-endian bytes.
        head = _array_heads.get((dtype, arr.shape)) or _array_head(dtype, arr.shape)
        if kind.per_element == 2:
            flat = flat.view(flat.real.dtype)   # complex -> (real, imag) pairs
        raw = flat.astype(_WIRE_NUMPY[kind.field], copy=False).tobytes()
        return head + _field(kind.field << 3 | 2, raw) if raw else head
    proto = pb.ArrayProto(dtype=dtype)
    proto.array_shape.SetInParent()   # present even for scalars: the canonical decode path needs it
    proto.array_shape.dim.extend(arr.shape)
    if kind.field == _STRING:
        proto.string_val.extend(_string_bytes(role, name, s, error) for s in flat.tolist())
    else:
        getattr(proto, _VALUE_FIELD_NAME[kind.field]).extend(flat.tolist())
    return proto.SerializeToString()


_array_heads: dict[tuple[int, tuple[int, ...]], bytes] = {}


def _array_head(dtype: int, shape: tuple[int, ...]) -> bytes:
    """An ArrayProto's bytes before its values: dtype, then array_shape (present even for
    scalars, as the canonical decode path needs it), as upb serializes them."""
    dims = b"".join(map(_varint, shape))
    head = b"\x08" + _varint(dtype) + _field(0x12, _field(0x0A, dims) if dims else b"")
    return _remember(_array_heads, (dtype, shape), head)


def _string_bytes(role: str, name: str, value: object, error: type[Exception]) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    raise error(f"{role} '{name}': DT_STRING values must be str or bytes, got {type(value).__name__}")


def _encode_entry(tag: int, role: str, name: str, value: np.ndarray | Sequence[Any],
                  error: type[Exception]) -> bytes:
    # Entries are framed by hand so that bytes follow insertion order (upb writes maps in
    # hash order): warmup files and test fixtures stay byte-for-byte reproducible.
    array = _encode_array(role, name, value, error)
    return _field(tag, _field(0x0A, name.encode()) + _field(0x12, array))


# (name, dtype, shape) of an output -> the bytes of its map entry before its packed values,
# and the values' wire dtype; None: not a packed float/double array (the general way).
_entry_prefixes: dict[tuple[str, np.dtype, tuple[int, ...]], tuple[bytes, np.dtype] | None] = {}
_UNPLANNED: Any = object()


def _entry_prefix(name: str, arr: np.ndarray) -> tuple[bytes, np.dtype] | None:
    dtype = _DTYPE_OF_NUMPY.get(arr.dtype)
    kind = None if dtype is None else _KINDS[dtype]
    if kind is None or kind.field not in _WIRE_NUMPY or kind.per_element != 1 or arr.size == 0:
        return _remember(_entry_prefixes, (name, arr.dtype, arr.shape), None)  # type: ignore[no-any-return]
    wire = _WIRE_NUMPY[kind.field]
    raw = arr.size * wire.itemsize
    array_length = len(_array_head(dtype, arr.shape)) + 1 + len(_varint(raw)) + raw
    key = _field(0x0A, name.encode())
    entry_length = len(key) + 1 + len(_varint(array_length)) + array_length
    prefix = (b"\x0a" + _varint(entry_length) + key + b"\x12" + _varint(array_length)
              + _array_head(dtype, arr.shape) + bytes((kind.field << 3 | 2,)) + _varint(raw))
    return _remember(_entry_prefixes, (name, arr.dtype, arr.shape), (prefix, wire))  # type: ignore[no-any-return]


def encode_response(outputs: Mapping[str, np.ndarray]) -> bytes:
    """{output name: array} -> PredictResponse bytes. A dtype the wire cannot carry (e.g.
    uint64) raises InternalError: it is a property of the model, not of the request.
    A float or double output's entry is its cached head (per name, dtype and shape) and its
    values' bytes: the same bytes as _encode_entry writes, without building them each time
    (the Python route encodes every answer of a merged run)."""
    parts = []
    for name, value in outputs.items():
        plan = _entry_prefixes.get((name, value.dtype, value.shape), _UNPLANNED) if type(value) is np.ndarray else None
        if plan is _UNPLANNED:
            plan = _entry_prefix(name, value)
        if plan is None:
            parts.append(_encode_entry(0x0A, "output", name, value, InternalError))
        else:
            parts.append(plan[0] + value.astype(plan[1], copy=False).tobytes())
    return b"".join(parts)


def encode_request(inputs: Mapping[str, np.ndarray | list[Any]],
                   signature_name: str = "serving_default",
                   output_filter: Sequence[str] = ()) -> bytes:
    """{input name: array or list} -> PredictRequest bytes (clients, tests, warmup files).
    Strings (str, encoded as UTF-8, or bytes) become DT_STRING."""
    parts = [_field(0x0A, signature_name.encode())] if signature_name else []
    parts.extend(_encode_entry(0x12, "input", name, value, RequestError) for name, value in inputs.items())
    parts.extend(_field(0x1A, name.encode()) for name in output_filter)
    return b"".join(parts)


_MODEL_INFO_FIELDS = tuple(f.name for f in pb.ServingModelInfo.DESCRIPTOR.fields)


def encode_model_info(info: Mapping[str, Any]) -> bytes:
    """ServingModelInfo bytes from a model-info dict (e.g. `Processor.model_info()`).

    Reads model_path, model_version (or `version`), global_step, delta_step,
    update_time (Unix seconds as int/float, or RFC 3339 text such as
    "2024-05-01T12:00:00Z") and signature_name; ignores other keys (model info may
    describe more than the wire message carries). Missing or None leaves the default.
    """
    fields = {name: info[name] for name in _MODEL_INFO_FIELDS if info.get(name) is not None}
    if "model_version" not in fields and info.get("version") is not None:
        fields["model_version"] = str(info["version"])
    try:
        if "update_time" in fields:
            fields["update_time"] = _unix_seconds(fields["update_time"])
        return pb.ServingModelInfo(**fields).SerializeToString()
    except (TypeError, ValueError) as exc:
        raise InternalError(f"model info cannot be encoded as ServingModelInfo: {exc}") from exc


def _unix_seconds(value: object) -> int:
    if isinstance(value, str):
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        return int(moment.timestamp())
    if isinstance(value, (int, float)):
        return int(value)
    raise TypeError(f"update_time must be Unix seconds or RFC 3339 text, got {type(value).__name__}")


def decode_model_info(data: bytes) -> dict[str, Any]:
    """ServingModelInfo bytes -> {field name: value}, every field present (defaults included)."""
    try:
        info = pb.ServingModelInfo.FromString(data)
    except message.DecodeError as exc:
        raise RequestError(f"not a valid tensorflow.eas.ServingModelInfo: {exc}") from exc
    return {name: getattr(info, name) for name in _MODEL_INFO_FIELDS}
