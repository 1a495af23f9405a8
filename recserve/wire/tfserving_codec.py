"""TF Serving's gRPC messages <-> numpy: PredictRequest in, PredictResponse out (TensorProto).

Decoding is native (`_codec_native.parse_tfs`: the same parse, layouts and request routes
as the EAS protocol) unless ``RECSERVE_PURE_PYTHON=1`` is set or the C side declines; then
`decode_predict_request` here decides, and it is the specification both follow: each input
becomes what TensorFlow's ``Tensor::FromProto`` makes of its TensorProto --
``tensor_content`` holds exactly the shape's elements (strings in TensorFlow's string-list
encoding); otherwise the dtype's ``*_val`` field holds them, or fewer and the last value
repeats, or none and the tensor is zeros; values beyond the shape's count are ignored;
``tensor_shape.unknown_rank`` is ignored. recserve bounds the repeat: a request may be short
of at most ``TFS_MAX_FILL`` elements in all (TF Serving would allocate whatever the shape
says).

Outputs are written as TF Serving writes them by default (``Tensor::AsProtoField``: the
dtype's ``*_val`` field, packed, every element) so ``tf.make_ndarray`` reads them.
Stateless, thread-safe.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from google.protobuf import message

from recserve.errors import InternalError, RequestError
from recserve.proto import tensor_bundle_pb2
from recserve.proto import tfserving_pb2 as pb
from recserve.wire.codec import DecodedRequest

if TYPE_CHECKING:
    from recserve.wire._codec_native import ParsedRequest

__all__ = [
    "DEFAULT_SIGNATURE",
    "TFS_MAX_FILL",
    "ModelSpec",
    "TfsRequest",
    "decode_predict_request",
    "encode_predict_outputs",
    "encode_predict_request",
    "encode_predict_response",
    "leading_model_spec",
    "model_spec_bytes",
    "model_spec_field",
    "numpy_of_dtype",
    "parse_predict_request",
    "shape_proto",
    "tensor_to_array",
    "tf_dtype",
]

DEFAULT_SIGNATURE = "serving_default"   # TF Serving's kDefaultServingSignatureDefKey
TFS_MAX_FILL = 1 << 20                  # RS_CODEC_TFS_MAX_FILL (native/codec.h)
_MAX_DIMS = 254                         # TensorShape::MaxDimensions()


class ModelSpec(NamedTuple):
    """A request's model_spec: version and version_label are None when not set. (Tuples:
    made per request, cheaper than frozen dataclasses.)"""

    name: str
    version: int | None = None
    version_label: str | None = None
    signature_name: str = ""


class TfsRequest(NamedTuple):
    """A PredictRequest: its model spec, and its inputs either parsed natively (`parsed`) or
    still to be decoded by `decoded()` (which raises RequestError naming the bad input)."""

    spec: ModelSpec
    parsed: ParsedRequest | None
    message: Any = None   # the generated PredictRequest, when `parsed` is None

    def decoded(self) -> DecodedRequest:
        if self.parsed is not None:
            recipe = self.parsed.recipe
            return DecodedRequest(recipe.signature_name, self.parsed.inputs(), recipe.output_filter)
        request = self.message
        fill = [TFS_MAX_FILL]   # elements the request's *_val fields may still be short of
        inputs = {name: tensor_to_array(name, proto, fill) for name, proto in request.inputs.items()}
        return DecodedRequest(self.spec.signature_name, inputs, tuple(request.output_filter))


# dtype -> (numpy dtype, value field); the dtypes recserve takes in and gives out.
_KINDS: dict[int, tuple[np.dtype[Any], str]] = {
    pb.DT_FLOAT: (np.dtype(np.float32), "float_val"),
    pb.DT_DOUBLE: (np.dtype(np.float64), "double_val"),
    pb.DT_HALF: (np.dtype(np.float16), "half_val"),
    pb.DT_INT8: (np.dtype(np.int8), "int_val"),
    pb.DT_INT16: (np.dtype(np.int16), "int_val"),
    pb.DT_INT32: (np.dtype(np.int32), "int_val"),
    pb.DT_INT64: (np.dtype(np.int64), "int64_val"),
    pb.DT_UINT8: (np.dtype(np.uint8), "int_val"),
    pb.DT_UINT16: (np.dtype(np.uint16), "int_val"),
    pb.DT_UINT32: (np.dtype(np.uint32), "uint32_val"),
    pb.DT_UINT64: (np.dtype(np.uint64), "uint64_val"),
    pb.DT_BOOL: (np.dtype(np.bool_), "bool_val"),
    pb.DT_STRING: (np.dtype(object), "string_val"),
}
_SUPPORTED = ", ".join(pb.DataType.Name(d) for d in sorted(_KINDS))
_DTYPE_OF_NUMPY = {numpy: d for d, (numpy, _) in _KINDS.items() if d != pb.DT_STRING}
_NUMPY_OF_NAME = {str(numpy): d for d, (numpy, _) in _KINDS.items()} | {"string": pb.DT_STRING}


def tf_dtype(numpy_name: str) -> int:
    """recserve's dtype name (numpy's, or "string") -> TensorFlow's DataType (DT_INVALID if none)."""
    return _NUMPY_OF_NAME.get(numpy_name, pb.DT_INVALID)


def numpy_of_dtype(dtype: int) -> np.dtype[Any] | None:
    kind = _KINDS.get(dtype)
    return None if kind is None else kind[0]


def _parsing_error(name: str, why: str) -> RequestError:
    # TF Serving's own message starts "tensor parsing error: <alias>".
    return RequestError(f"tensor parsing error: {name}: {why}")


def _string_list(name: str, content: bytes, n: int) -> list[bytes]:
    """TensorFlow's string-list encoding (port::EncodeStringList): n varint32 lengths, then
    the strings back to back."""
    lengths, at = [], 0
    for _ in range(n):
        value = shift = 0
        while True:
            if at >= len(content) or shift > 28:
                raise _parsing_error(name, f"tensor_content does not hold {n} DT_STRING lengths")
            byte = content[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        lengths.append(value)
    if at + sum(lengths) != len(content):
        raise _parsing_error(name, f"tensor_content's {n} DT_STRING values do not fill its {len(content)} bytes")
    strings = []
    for length in lengths:
        strings.append(content[at:at + length])
        at += length
    return strings


def tensor_to_array(name: str, proto: Any, fill: list[int] | None = None) -> np.ndarray:
    """One TensorProto -> its array, as Tensor::FromProto reads it (module docstring).
    `fill`: [elements the request's *_val fields may still be short of], decremented here."""
    dtype = proto.dtype
    kind = _KINDS.get(dtype)
    if kind is None:
        what = "dtype is not set (DT_INVALID)" if dtype == pb.DT_INVALID else (
            f"dtype {pb.DataType.Name(dtype)}" if dtype in pb.DataType.values() else f"dtype {dtype}")
        raise _parsing_error(name, f"{what} is not supported; supported: {_SUPPORTED}")
    numpy, field = kind
    dims = [d.size for d in proto.tensor_shape.dim]
    if len(dims) > _MAX_DIMS:
        raise _parsing_error(name, f"tensor_shape has {len(dims)} dimensions; at most {_MAX_DIMS}")
    if any(d < 0 for d in dims):
        raise _parsing_error(name, f"tensor_shape {dims} has a negative dimension; dimensions must be >= 0")
    n = math.prod(dims)
    if n > 2**31 - 1 or math.prod(d for d in dims if d) > 2**31 - 1:
        raise _parsing_error(name, f"tensor_shape {dims} is too large: more than {2**31 - 1} elements")
    if n == 0:
        return np.empty(dims, dtype=numpy)
    content = proto.tensor_content
    if content:
        if dtype == pb.DT_STRING:
            flat = np.empty(n, dtype=object)
            flat[:] = _string_list(name, content, n)
            return flat.reshape(dims)
        if len(content) != n * numpy.itemsize:
            raise _parsing_error(
                name, f"tensor_content has {len(content)} bytes; tensor_shape {dims} of "
                f"{pb.DataType.Name(dtype)} needs {n * numpy.itemsize}")
        if dtype == pb.DT_BOOL:
            return (np.frombuffer(content, np.uint8) != 0).reshape(dims)
        return np.frombuffer(content, numpy.newbyteorder("<")).astype(numpy).reshape(dims)
    values = getattr(proto, field)
    have = len(values)
    left = TFS_MAX_FILL if fill is None else fill[0]
    if have < n and fill is not None:
        fill[0] -= n - have
    if have < n and n - have > left:
        raise _parsing_error(
            name, f"tensor_shape {dims} has {n} elements and {field} holds {have}: recserve repeats "
            f"the last value (or zero) for at most {TFS_MAX_FILL} missing elements in a request")
    if dtype == pb.DT_STRING:
        strings = list(values[:n])
        flat = np.empty(n, dtype=object)
        flat[:] = strings + [strings[-1] if strings else b""] * (n - have)
        return flat.reshape(dims)
    wire = np.array(values[:n]) if have else np.zeros(0)
    if dtype == pb.DT_HALF:
        flat = wire.astype(np.uint16).view(np.float16)
    else:
        flat = wire.astype(numpy)   # int_val into narrower ints wraps, as C++'s conversion does
    if have < n:
        flat = np.concatenate([flat, np.full(n - have, flat[-1] if have else 0, dtype=flat.dtype)])
    return flat.reshape(dims)


def _spec(proto: Any) -> ModelSpec:
    choice = proto.WhichOneof("version_choice")
    return ModelSpec(
        proto.name,
        proto.version.value if choice == "version" else None,
        proto.version_label if choice == "version_label" else None,
        proto.signature_name,
    )


def decode_predict_request(data: bytes) -> TfsRequest:
    """The request's model spec, its inputs left to `decoded()`; RequestError if `data` is
    not a PredictRequest."""
    try:
        request = pb.PredictRequest.FromString(data)
    except message.DecodeError as exc:
        raise RequestError(f"request is not a valid tensorflow.serving.PredictRequest ({len(data)} bytes): {exc}") from exc
    return TfsRequest(_spec(request.model_spec), None, request)


def _native_parse() -> Any:
    if os.environ.get("RECSERVE_PURE_PYTHON") == "1":
        return None
    from recserve.wire._codec_native import parse_tfs
    return parse_tfs


_parse_tfs = _native_parse()


def parse_predict_request(data: bytes) -> TfsRequest:
    """The native parse when it takes `data`, else `decode_predict_request`."""
    got = _parse_tfs(data) if _parse_tfs is not None else None
    if got is None:
        return decode_predict_request(data)
    (name, version, label), parsed = got
    return TfsRequest(ModelSpec(name, version, label, parsed.recipe.signature_name), parsed)


_leading: dict[bytes, ModelSpec] = {}


def leading_model_spec(data: bytes) -> ModelSpec | None:
    """The ModelSpec a PredictRequest starts with (field 1 first: protobuf serializers write
    fields in number order), without parsing the rest; None when it does not start with one
    that parses. A second model_spec later in `data` would merge into it: the caller must
    not take this for the request's spec unless the native parser, which declines such
    requests, took `data`. Specs are cached by their bytes (a client repeats them)."""
    if len(data) < 2 or data[0] != 0x0A:
        return None
    size, at = data[1], 2
    if size >= 0x80:   # a spec of 128 bytes to 16 KiB
        if len(data) < 3 or data[2] >= 0x80:
            return None
        size, at = (size & 0x7F) | data[2] << 7, 3
    raw = data[at:at + size]
    spec = _leading.get(raw)
    if spec is None:
        if len(raw) != size:
            return None
        try:
            spec = _spec(pb.ModelSpec.FromString(raw))
        except message.DecodeError:
            return None
        if len(_leading) < 4096:
            _leading[raw] = spec
    return spec


# --- encoding ------------------------------------------------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


_heads: dict[tuple[int, tuple[int, ...]], bytes] = {}
_PACKED_FIXED = {pb.DT_FLOAT: b"\x2a", pb.DT_DOUBLE: b"\x32"}   # float_val, double_val tags


def _head(dtype: int, shape: tuple[int, ...]) -> bytes:
    """dtype and tensor_shape (present even for a scalar), as AsProtoField writes them."""
    head = _heads.get((dtype, shape))
    if head is None:
        dims = b"".join(_field(0x12, b"\x08" + _varint(d) if d else b"") for d in shape)
        head = b"\x08" + _varint(dtype) + _field(0x12, dims)
        if len(_heads) < 4096:
            _heads[(dtype, shape)] = head
    return head


def _tensor_bytes(name: str, value: np.ndarray) -> bytes:
    arr = np.asarray(value)
    if arr.dtype.kind in "OSU":
        return _head(pb.DT_STRING, arr.shape) + b"".join(
            _field(0x42, v if isinstance(v, bytes) else str(v).encode()) for v in arr.reshape(-1).tolist())
    dtype = _DTYPE_OF_NUMPY.get(arr.dtype) or _DTYPE_OF_NUMPY.get(arr.dtype.newbyteorder("="), pb.DT_INVALID)
    if dtype == pb.DT_INVALID:
        raise InternalError(f"output '{name}': numpy dtype {arr.dtype} has no TensorFlow dtype recserve writes; "
                            f"supported: {_SUPPORTED}")
    head = _heads.get((dtype, arr.shape)) or _head(dtype, arr.shape)
    if arr.size == 0:
        return head
    if dtype in _PACKED_FIXED:
        # Packed float/double values are the array's little-endian bytes.
        raw = arr.tobytes() if arr.dtype.byteorder != ">" else arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        return head + _PACKED_FIXED[dtype] + _varint(len(raw)) + raw
    proto = pb.TensorProto()
    flat = arr.reshape(-1)
    if dtype == pb.DT_HALF:
        proto.half_val.extend(flat.view(np.uint16).tolist())
    else:
        getattr(proto, _KINDS[dtype][1]).extend(flat.tolist())
    return head + proto.SerializeToString()


def encode_predict_outputs(outputs: Mapping[str, np.ndarray]) -> bytes:
    """{output alias: array} -> a PredictResponse's outputs field (map entries in the
    outputs' order): the response up to its model_spec (`model_spec_field`)."""
    return b"".join([_field(0x0A, _field(0x0A, name.encode()) + _field(0x12, _tensor_bytes(name, value)))
                     for name, value in outputs.items()])


def encode_predict_response(outputs: Mapping[str, np.ndarray], spec: bytes) -> bytes:
    """{output alias: array} + the serialized ModelSpec -> PredictResponse bytes, fields in
    number order as TF Serving's C++ writes them (map entries in the outputs' order)."""
    return encode_predict_outputs(outputs) + _field(0x12, spec)


_specs: dict[tuple[str, int | None, str], bytes] = {}
_spec_fields: dict[tuple[str, int | None, str], bytes] = {}


def model_spec_field(name: str, version: int | None, signature_name: str) -> bytes:
    """A PredictResponse's model_spec field (2) as `encode_predict_response` ends with it:
    appended to the native route's outputs (Processor.process_tfs)."""
    got = _spec_fields.get((name, version, signature_name))
    if got is None:
        got = _field(0x12, model_spec_bytes(name, version, signature_name))
        if len(_spec_fields) < 4096:
            _spec_fields[(name, version, signature_name)] = got
    return got


def model_spec_bytes(name: str, version: int | None, signature_name: str) -> bytes:
    """A response's ModelSpec (name, version, signature_name)."""
    got = _specs.get((name, version, signature_name))
    if got is None:
        spec = pb.ModelSpec(name=name, signature_name=signature_name)
        if version is not None:
            spec.version.value = version
        got = spec.SerializeToString()
        if len(_specs) < 4096:
            _specs[(name, version, signature_name)] = got
    return got


def shape_proto(dims: Sequence[int | None]) -> Any:
    """A TensorShapeProto; an unknown dimension (None or < 0) is -1, as TensorFlow writes it."""
    return tensor_bundle_pb2.TensorShapeProto(
        dim=[tensor_bundle_pb2.TensorShapeProto.Dim(size=-1 if d is None or d < 0 else d) for d in dims])


def _request_tensor(name: str, value: np.ndarray) -> bytes:
    """One input as tf.make_tensor_proto writes an array: numbers as tensor_content, bools in
    bool_val, strings in string_val."""
    arr = np.asarray(value)
    if arr.dtype.kind in "OSU" or arr.dtype == np.bool_:
        return _tensor_bytes(name, arr)
    dtype = _DTYPE_OF_NUMPY.get(arr.dtype.newbyteorder("="), pb.DT_INVALID)
    if dtype == pb.DT_INVALID:
        raise RequestError(f"input '{name}': numpy dtype {arr.dtype} has no TensorFlow dtype; supported: {_SUPPORTED}")
    content = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
    return _head(dtype, arr.shape) + (_field(0x22, content) if content else b"")


def encode_predict_request(inputs: Mapping[str, np.ndarray], model: str, *, signature_name: str = "",
                           output_filter: Sequence[str] = (), version: int | None = None) -> bytes:
    """{input alias: array} -> tensorflow.serving.PredictRequest bytes (clients: perf, benchmarks)."""
    spec = pb.ModelSpec(name=model, signature_name=signature_name)
    if version is not None:
        spec.version.value = version
    parts = [_field(0x0A, spec.SerializeToString())]
    parts.extend(_field(0x12, _field(0x0A, name.encode()) + _field(0x12, _request_tensor(name, value)))
                 for name, value in inputs.items())
    parts.extend(_field(0x1A, name.encode()) for name in output_filter)
    return b"".join(parts)
