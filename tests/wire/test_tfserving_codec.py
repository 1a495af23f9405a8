"""TF Serving's PredictRequest decoding: the native parser (rs_decode_tfs_request) against its
Python twin (recserve.wire.tfserving_codec) on random requests in every wire form and on
corrupted ones (identical arrays or the same RequestError message); raw-bytes cases
(truncated, huge shapes, wrong tensor_content lengths, negative dimensions); what
TensorFlow's own make_tensor_proto writes; and responses that tf.make_ndarray reads."""

from __future__ import annotations

import os
import random
import struct

import numpy as np
import pytest

from recserve.errors import RequestError
from recserve.wire import tfserving_codec as tfs
from tests.wire.test_codec_native import exact, key, varint
from tests.wire.test_codec_native import length_delimited as ld

NATIVE = os.environ.get("RECSERVE_PURE_PYTHON") != "1"
if NATIVE:
    from recserve.wire import _codec_native as native


def outcome(decode: object, data: bytes) -> tuple[object, ...]:
    try:
        request = decode(data)  # type: ignore[operator]
        decoded = request.decoded()
    except RequestError as exc:
        return ("error", exc.message)
    arrays = sorted((name, a.dtype.str, a.shape, exact(a)) for name, a in decoded.inputs.items())
    return ("ok", request.spec, decoded.signature_name, decoded.output_filter, arrays)


def assert_same(data: bytes) -> bool:
    """The native route's result equals the twin's; True when the native parser took it."""
    assert outcome(tfs.parse_predict_request, data) == outcome(tfs.decode_predict_request, data), data.hex()
    return NATIVE and native.parse_tfs(data) is not None


# --- hand-made requests ------------------------------------------------------------------

# dtype -> (value field, wire type of one value, struct format or None for varints)
_FIELDS = {1: (5, 5, "<f"), 2: (6, 1, "<d"), 3: (7, 0, None), 9: (10, 0, None), 10: (11, 0, None),
           7: (8, 2, None), 19: (13, 0, None), 4: (7, 0, None), 5: (7, 0, None), 6: (7, 0, None),
           17: (7, 0, None), 22: (16, 0, None), 23: (17, 0, None)}
_CONTENT = {1: "<f", 2: "<d", 3: "<i", 9: "<q", 10: "<B", 19: "<e", 4: "<B", 5: "<h", 6: "<b", 17: "<H",
            22: "<I", 23: "<Q"}


def shape(dims: list[int], unknown_rank: bool = False) -> bytes:
    body = b"".join(ld(2, key(1, 0) + varint(d) if d else b"") for d in dims)
    return body + (key(3, 0) + b"\x01" if unknown_rank else b"")


def tensor(dtype: int, dims: list[int] | None, values: list[object] = (), *, content: bytes | None = None,
           packed: bool = True) -> bytes:
    out = key(1, 0) + varint(dtype)
    if dims is not None:
        out += ld(2, shape(dims))
    if content is not None:
        out += ld(4, content)
    if values:
        field, wt, fmt = _FIELDS[dtype]
        if field == 8:
            out += b"".join(ld(8, v) for v in values)  # type: ignore[arg-type]
        elif packed:
            out += ld(field, b"".join(struct.pack(fmt, v) if fmt else varint(int(v)) for v in values))
        else:
            out += b"".join(key(field, wt) + (struct.pack(fmt, v) if fmt else varint(int(v))) for v in values)
    return out


def request(inputs: dict[str, bytes], name: str = "m", *, version: int | None = None, label: str | None = None,
            signature: str = "", output_filter: tuple[str, ...] = ()) -> bytes:
    spec = ld(1, name.encode()) if name else b""
    if version is not None:
        spec += ld(2, key(1, 0) + varint(version) if version else b"")
    if label is not None:
        spec += ld(4, label.encode())
    if signature:
        spec += ld(3, signature.encode())
    out = ld(1, spec)
    out += b"".join(ld(2, ld(1, k.encode()) + ld(2, v)) for k, v in inputs.items())
    return out + b"".join(ld(3, f.encode()) for f in output_filter)


def error_of(data: bytes) -> str:
    with pytest.raises(RequestError) as caught:
        tfs.parse_predict_request(data).decoded()
    assert outcome(tfs.decode_predict_request, data) == ("error", caught.value.message)
    return caught.value.message


def arrays_of(data: bytes) -> dict[str, np.ndarray]:
    assert_same(data)
    return tfs.parse_predict_request(data).decoded().inputs


def test_native_takes_the_common_forms():
    forms = {
        "content": tensor(1, [2, 2], content=np.arange(4, dtype="<f4").tobytes()),
        "int32 content": tensor(3, [3], content=np.array([-1, 2, 3], "<i4").tobytes()),
        "bool content": tensor(10, [3], content=bytes([0, 1, 7])),
        "int64 packed": tensor(9, [2], [-5, 2**62]),
        "double unpacked": tensor(2, [2], [0.5, -1.0], packed=False),
        "strings": tensor(7, [2], [b"a", "\u00e9".encode()]),
        "scalar": tensor(1, [], [2.5]),
        "no shape": tensor(1, None, [2.5]),
        "broadcast": tensor(9, [4], [7]),
        "zeros": tensor(1, [3]),
        "string fill": tensor(7, [3], [b"z"]),
    }
    for name, data in forms.items():
        full = request({"x": data}, version=3, signature="sig", output_filter=("y",))
        assert assert_same(full) or not NATIVE, name
    spec = tfs.parse_predict_request(request({"x": forms["scalar"]}, name="m", version=-4, signature="s")).spec
    assert spec == tfs.ModelSpec("m", -4, None, "s")
    spec = tfs.parse_predict_request(request({"x": forms["scalar"]}, label="canary")).spec
    assert spec == tfs.ModelSpec("m", None, "canary", "")


def test_tensor_from_proto_rules():
    got = arrays_of(request({
        "fill": tensor(9, [2, 3], [1, 2]), "zeros": tensor(3, [2]), "more": tensor(1, [2], [1.0, 2.0, 3.0]),
        "half": tensor(19, [2], [0x3C00]), "narrow": tensor(6, [2], [300, -1]), "empty": tensor(1, [0, 4], [1.0]),
        "strings": tensor(7, [2], content=varint(1) + varint(2) + b"abc"),
        "bools": tensor(10, [2], content=b"\x00\x02"),
    }))
    assert got["fill"].tolist() == [[1, 2, 2], [2, 2, 2]] and got["fill"].dtype == np.int64
    assert got["zeros"].tolist() == [0, 0] and got["zeros"].dtype == np.int32
    assert got["more"].tolist() == [1.0, 2.0]          # values beyond the shape are ignored
    assert got["half"].tolist() == [1.0, 1.0] and got["half"].dtype == np.float16
    assert got["narrow"].tolist() == [44, -1]          # int_val wraps into int8, as C++ converts
    assert got["empty"].shape == (0, 4)
    assert got["strings"].tolist() == [b"a", b"bc"]    # TensorFlow's string-list tensor_content
    assert got["bools"].tolist() == [False, True]


def test_bad_tensors_name_the_input():
    assert error_of(request({"age": tensor(1, [2, 1], content=b"\x00" * 7)})) == (
        "tensor parsing error: age: tensor_content has 7 bytes; tensor_shape [2, 1] of DT_FLOAT needs 8")
    assert error_of(request({"x": tensor(9, [-1, 2], [1])})) == (
        "tensor parsing error: x: tensor_shape [-1, 2] has a negative dimension; dimensions must be >= 0")
    assert error_of(request({"x": tensor(9, [2**40, 2**40], [1])})).startswith(
        "tensor parsing error: x: tensor_shape [1099511627776, 1099511627776] is too large")
    assert error_of(request({"x": tensor(9, [2**21], [1])})).startswith(
        "tensor parsing error: x: tensor_shape [2097152] has 2097152 elements and int64_val holds 1: "
        "recserve repeats the last value")
    assert error_of(request({"x": tensor(8, [1])})).startswith(
        "tensor parsing error: x: dtype DT_COMPLEX64 is not supported; supported: DT_FLOAT, DT_DOUBLE")
    assert error_of(request({"x": tensor(0, [1])})).startswith("tensor parsing error: x: dtype is not set")
    assert error_of(request({"x": tensor(77, [1])})).startswith("tensor parsing error: x: dtype 77 is not")
    assert error_of(request({"s": tensor(7, [2], content=varint(5) + b"\x80")})) == (
        "tensor parsing error: s: tensor_content does not hold 2 DT_STRING lengths")
    assert error_of(request({"s": tensor(7, [2], content=varint(5) + b"\x01ab")})) == (
        "tensor parsing error: s: tensor_content's 2 DT_STRING values do not fill its 4 bytes")


def test_malformed_and_truncated_bytes():
    good = request({"x": tensor(1, [2, 2], content=np.arange(4, dtype="<f4").tobytes()), "y": tensor(9, [2], [1, 2])},
                   version=1, signature="s", output_filter=("o",))
    assert assert_same(good) or not NATIVE
    for cut in range(1, len(good)):
        assert_same(good[:cut])
    for data in (b"\xff", b"\x0a\x80", b"\x12\x05\x0a\x01x", b"\x0b", good + b"\x12"):
        message = error_of(data)
        assert message.startswith("request is not a valid tensorflow.serving.PredictRequest"), message


def test_values_full_is_retried_with_the_fill_bound():
    """A tiny request whose one value fills ~1M elements: more than size + 1 slots."""
    n = tfs.TFS_MAX_FILL
    data = request({"x": tensor(7, [n], [b"q"]), "y": tensor(2, [n // 2], [1.5])})
    with pytest.raises(RequestError):  # 1.5M elements short in all: beyond the bound
        tfs.parse_predict_request(data).decoded()
    data = request({"x": tensor(7, [n // 2], [b"q"]), "y": tensor(2, [n // 2], [1.5])})
    got = arrays_of(data)
    assert got["x"].shape == (n // 2,) and got["x"][-1] == b"q" and got["y"][-1] == 1.5
    if NATIVE:
        assert native.parse_tfs(data) is not None


# --- random requests and corruptions ------------------------------------------------------

_DTYPES = list(_FIELDS) + [0, 8, 14, 99]


def _random_tensor(rng: random.Random) -> bytes:
    dtype = rng.choice(_DTYPES)
    dims = [rng.choice([0, 1, 2, 3, 5]) for _ in range(rng.choice([0, 1, 1, 2, 3]))]
    n = int(np.prod(dims)) if dims else 1
    if rng.random() < 0.05:
        dims[0:0] = [rng.choice([-1, 2**33])]
    count = rng.choice([n, n, n, 0, 1, n + 1, max(n - 1, 0)])
    field, _, fmt = _FIELDS.get(dtype, (5, 5, "<f"))
    if field == 8:
        values = [bytes(rng.randrange(256) for _ in range(rng.randrange(4))) for _ in range(count)]
    elif fmt:
        values = [rng.uniform(-1e3, 1e3) for _ in range(count)]
    else:
        values = [rng.randrange(-2**40, 2**40) if field in (7, 10, 17) else rng.randrange(0, 2**16)
                  for _ in range(count)]
        if field == 11:
            values = [rng.randrange(2) for _ in range(count)]
    if dtype in _CONTENT and rng.random() < 0.4:
        fmt = _CONTENT[dtype]
        size = struct.calcsize(fmt)
        raw = bytes(rng.randrange(256) for _ in range(size * rng.choice([n, n, n + 1, max(n - 1, 0)])))
        body = tensor(dtype, dims, content=raw)
    else:
        body = tensor(dtype, dims, values if dtype in _FIELDS else [], packed=rng.random() < 0.7)
    extras = [key(3, 0) + varint(rng.randrange(3)), ld(99, b"junk"), key(7, 0) + varint(5), ld(14, b""),
              ld(2, shape([], unknown_rank=True))]
    if rng.random() < 0.15:
        body += rng.choice(extras)
    return body


def _random_request(rng: random.Random) -> bytes:
    inputs = {rng.choice(["ids", "x", "", "a:0", "\u00fc"]): _random_tensor(rng) for _ in range(rng.randrange(4))}
    return request(inputs, rng.choice(["m", "", "default"]), version=rng.choice([None, 1, 0, -3]),
                   label=rng.choice([None, None, "v"]), signature=rng.choice(["", "serving_default"]),
                   output_filter=tuple(rng.sample(["a", "b", "\u00e9"], rng.randrange(3))))


def _corrupt(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        what = rng.randrange(3)
        if what == 0 and b:
            b[rng.randrange(len(b))] = rng.randrange(256)
        elif what == 1 and b:
            del b[rng.randrange(len(b)):][: rng.randrange(1, 8)]
        else:
            at = rng.randrange(len(b) + 1)
            b[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 4)))
    return bytes(b)


def test_random_requests_and_corruptions_agree():
    rng = random.Random(27)
    taken = 0
    for i in range(3000):
        data = _random_request(rng)
        taken += assert_same(data)
        assert_same(_corrupt(rng, data))
        if i % 7 == 0:
            assert_same(data + data)   # repeated map entries and a second ModelSpec
    if NATIVE:
        assert taken > 600, taken   # the native parser takes the common forms


@pytest.mark.skipif("libasan" in os.environ.get("LD_PRELOAD", ""),
                    reason="importing TensorFlow throws C++ exceptions (matplotlib's), which abort with libasan "
                           "preloaded (make test-sanitize)")
def test_make_tensor_proto_and_make_ndarray():
    """What TensorFlow's client writes parses natively; what recserve answers, TensorFlow reads."""
    tf = pytest.importorskip("tensorflow")
    values = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "d": np.array([0.5, -2.0]),
              "i": np.array([-7, 8], np.int32), "l": np.array([2**50, -1]), "b": np.array([True, False]),
              "s": np.array([b"a", b"\xff"], dtype=object), "k": np.float32(3.0)}
    data = request({k: tf.make_tensor_proto(v).SerializeToString() for k, v in values.items()})
    if NATIVE:
        assert native.parse_tfs(data) is not None
    got = arrays_of(data)
    for k, v in values.items():
        assert got[k].tolist() == np.asarray(v).tolist() and got[k].dtype == np.asarray(v).dtype, k
    spec = tfs.model_spec_bytes("m", 3, "serving_default")
    from tensorflow_serving.apis import predict_pb2
    response = predict_pb2.PredictResponse.FromString(tfs.encode_predict_response(
        {**values, "h": np.array([1.5], np.float16), "u": np.array([[1], [2]], np.uint8),
         "z": np.zeros((0, 2), np.float32)}, spec))
    assert response.model_spec.name == "m" and response.model_spec.version.value == 3
    for k, v in values.items():
        back = tf.make_ndarray(response.outputs[k])
        assert back.tolist() == np.asarray(v).tolist() and back.dtype == np.asarray(v).dtype, k
    assert tf.make_ndarray(response.outputs["h"]).tolist() == [1.5]
    assert tf.make_ndarray(response.outputs["u"]).tolist() == [[1], [2]]
    assert tf.make_ndarray(response.outputs["z"]).shape == (0, 2)
