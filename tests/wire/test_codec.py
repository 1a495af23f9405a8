"""The request codec: bytes as real clients write them -> exact arrays, round trips for
every dtype, and the exact 400 messages. Every test runs twice: with the native decoder
and with its pure-Python twin, whose decode paths (canonical and message) are checked
against each other on every request."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from recserve.errors import InternalError, RequestError
from recserve.proto import predict_pb2 as pb
from recserve.wire import codec


@pytest.fixture(autouse=True, params=["native", "python"])
def decoder(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "python":
        monkeypatch.setattr(codec, "_native", None)
    elif codec._native is None:
        pytest.skip("the native decoder is off (RECSERVE_PURE_PYTHON=1)")
    return str(request.param)


# --- hand-written protobuf wire bytes (no generated code) -----------------------------------


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1   # negative ints are 10-byte two's complement varints
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return key(field, 2) + varint(len(payload)) + payload


def array(dtype: int, dims: list[int], values: bytes) -> bytes:
    return key(1, 0) + varint(dtype) + length_delimited(2, length_delimited(1, b"".join(map(varint, dims)))) + values


def entry(name: str, array_bytes: bytes) -> bytes:
    return length_delimited(2, length_delimited(1, name.encode()) + length_delimited(2, array_bytes))


def old_client_request(packed_floats: bool, strings: bool = True) -> bytes:
    floats = [0.5, -1.25, 3.0, 1e-3, 7.0, 8.5]
    if packed_floats:
        float_field = length_delimited(3, struct.pack("<6f", *floats))
    else:   # one (tag, fixed32) per value: what proto2-era encoders wrote
        float_field = b"".join(key(3, 5) + struct.pack("<f", v) for v in floats)
    ids = [7, -1, 2**40 + 3]
    return b"".join([
        length_delimited(1, b"serving_default"),
        entry("dense", array(1, [2, 3], float_field)),
        entry("user_id", array(9, [3], length_delimited(7, b"".join(map(varint, ids))))),
        entry("city", array(7, [2, 1], length_delimited(6, b"paris") + length_delimited(6, "z\u00fcrich".encode())))
        if strings else b"",
        length_delimited(3, b"prob"),
        length_delimited(3, b"logits"),
    ])


def both_paths(data: bytes) -> codec.DecodedRequest:
    """decode_request's result, checked equal to the message path's."""
    decoded = codec.decode_request(data)
    reference = codec._decode_message(data)
    assert decoded.signature_name == reference.signature_name
    assert decoded.output_filter == reference.output_filter
    assert decoded.inputs.keys() == reference.inputs.keys()
    for name, value in decoded.inputs.items():
        assert value.dtype == reference.inputs[name].dtype
        assert value.shape == reference.inputs[name].shape
        assert value.tolist() == reference.inputs[name].tolist()
    return decoded


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_old_client_bytes(packed: bool) -> None:
    decoded = both_paths(old_client_request(packed))
    assert decoded.signature_name == "serving_default"
    assert decoded.output_filter == ("prob", "logits")
    assert sorted(decoded.inputs) == ["city", "dense", "user_id"]
    dense = decoded.inputs["dense"]
    assert dense.dtype == np.float32 and dense.shape == (2, 3)
    assert dense.tolist() == [[0.5, -1.25, 3.0], [np.float32(1e-3), 7.0, 8.5]]
    user_id = decoded.inputs["user_id"]
    assert user_id.dtype == np.int64 and user_id.tolist() == [7, -1, 2**40 + 3]
    city = decoded.inputs["city"]
    assert city.dtype == object and city.shape == (2, 1)
    assert city.tolist() == [[b"paris"], ["z\u00fcrich".encode()]]


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "unpacked"])
def test_old_client_bytes_without_strings(packed: bool) -> None:
    data = old_client_request(packed, strings=False)
    # Packed values are canonical; unpacked ones must leave it to the message path.
    assert (codec._decode_canonical(data) is not None) == packed
    decoded = both_paths(data)
    assert decoded.inputs["dense"].tolist() == [[0.5, -1.25, 3.0], [np.float32(1e-3), 7.0, 8.5]]
    assert decoded.inputs["user_id"].tolist() == [7, -1, 2**40 + 3]


def test_canonical_path_takes_generated_bytes() -> None:
    request = pb.PredictRequest(signature_name="s", output_filter=["y"])
    a = request.inputs["ids"]
    a.dtype = pb.DT_INT64
    a.array_shape.dim.extend([2, 2])
    a.int64_val.extend([1, 2, -3, 2**62])
    b = request.inputs["x"]
    b.dtype = pb.DT_FLOAT
    b.array_shape.dim.extend([2])
    b.float_val.extend([1.5, 2.5])
    data = request.SerializeToString()
    decoded = codec._decode_canonical(data)
    assert decoded is not None
    assert decoded.inputs["ids"].tolist() == [[1, 2], [-3, 2**62]]
    assert decoded.inputs["x"].tolist() == [1.5, 2.5]
    assert decoded.signature_name == "s" and decoded.output_filter == ("y",)


def test_split_packed_chunks_are_concatenated() -> None:
    # A packed field may arrive in several chunks; parsers must concatenate them.
    values = length_delimited(7, varint(1) + varint(2)) + length_delimited(7, varint(3))
    data = entry("ids", array(9, [3], values))
    assert both_paths(data).inputs["ids"].tolist() == [1, 2, 3]


ROUND_TRIP = [
    np.array([[0.5, -2.0], [3.25, 1e30]], dtype=np.float32),
    np.array([1e-300, -2.5, np.pi], dtype=np.float64),
    np.array([1.5, -0.25], dtype=np.float16),
    np.array([1 + 2j, -3.5j], dtype=np.complex64),
    np.array([[1 + 2j], [0.25 - 1e200j]], dtype=np.complex128),
    np.array([-128, 0, 127], dtype=np.int8),
    np.array([-32768, 32767], dtype=np.int16),
    np.array([[-(2**31), 2**31 - 1, 0]], dtype=np.int32),
    np.array([0, 255], dtype=np.uint8),
    np.array([0, 65535], dtype=np.uint16),
    np.array([-(2**63), 2**63 - 1, 0, -1], dtype=np.int64),
    np.array([[True, False, True]]),
    np.array([b"a", b"", "\u00fc".encode()], dtype=object),
]


@pytest.mark.parametrize("value", ROUND_TRIP, ids=lambda v: str(v.dtype))
def test_round_trip_every_dtype(value: np.ndarray) -> None:
    data = codec.encode_request({"x": value})
    # encode_request writes canonical bytes: every non-string dtype takes the canonical path.
    assert (codec._decode_canonical(data) is None) == (value.dtype == object)
    decoded = both_paths(data)
    assert decoded.inputs["x"].dtype == value.dtype
    assert decoded.inputs["x"].shape == value.shape
    assert decoded.inputs["x"].tolist() == value.tolist()
    response = codec.decode_response(codec.encode_response({"y": value}))
    assert response["y"].dtype == value.dtype and response["y"].tolist() == value.tolist()


@pytest.mark.parametrize("shape", [(), (1,), (5,), (4, 3), (0,), (0, 13), (2, 0, 3)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.bool_])
def test_round_trip_shapes(shape: tuple[int, ...], dtype: type) -> None:
    value = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
    data = codec.encode_request({"a": value, "b": value})
    assert codec._decode_canonical(data) is not None
    decoded = both_paths(data)
    for name in ("a", "b"):
        assert decoded.inputs[name].dtype == np.dtype(dtype)
        assert decoded.inputs[name].shape == shape
        assert decoded.inputs[name].tolist() == value.tolist()


def test_strings_and_lists_in_encode_request() -> None:
    data = codec.encode_request({"city": ["paris", b"rome"], "n": [1, 2]}, output_filter=["p"])
    request = pb.PredictRequest.FromString(data)
    assert request.signature_name == "serving_default" and list(request.output_filter) == ["p"]
    assert request.inputs["city"].dtype == pb.DT_STRING
    assert list(request.inputs["city"].string_val) == [b"paris", b"rome"]
    assert request.inputs["n"].dtype == pb.DT_INT64 and list(request.inputs["n"].int64_val) == [1, 2]


def test_float_response_is_packed_float_val() -> None:
    data = codec.encode_response({"prob": np.array([[0.25], [0.75]], dtype=np.float32)})
    expected = length_delimited(1, length_delimited(1, b"prob") + length_delimited(
        2, array(1, [2, 1], length_delimited(3, struct.pack("<2f", 0.25, 0.75)))))
    assert data == expected
    assert pb.PredictResponse.FromString(data).outputs["prob"].float_val == [0.25, 0.75]


@pytest.mark.parametrize("value", [
    np.float32(0.5), np.zeros((0, 3), np.float32), np.arange(40, dtype=np.float64).reshape(2, 20),
    np.array([1.5, -0.25], np.float16), np.array([1 + 2j], np.complex64), np.array([[3 - 1j]], np.complex128),
    np.arange(6, dtype=">f4").reshape(2, 3), np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2],
], ids=lambda v: f"{v.dtype}{list(v.shape)}")
def test_float_outputs_are_what_upb_writes(value: np.ndarray) -> None:
    kind = codec._KINDS[codec._DTYPE_OF_NUMPY[value.dtype.newbyteorder("=")]]
    proto = pb.ArrayProto(dtype=codec._DTYPE_OF_NUMPY[value.dtype.newbyteorder("=")])
    proto.array_shape.SetInParent()
    proto.array_shape.dim.extend(value.shape)
    flat = value.reshape(-1)
    getattr(proto, codec._VALUE_FIELD_NAME[kind.field]).extend(
        flat.view(flat.real.dtype).tolist() if kind.per_element == 2 else flat.tolist())
    expected = pb.PredictResponse()
    expected.outputs["y"].CopyFrom(proto)
    assert codec.encode_response({"y": value}) == expected.SerializeToString()


def test_empty_request() -> None:
    decoded = both_paths(b"")
    assert decoded == codec.DecodedRequest("", {}, ())


# --- errors -----------------------------------------------------------------------------------

SUPPORTED = ("DT_FLOAT, DT_DOUBLE, DT_INT32, DT_UINT8, DT_INT16, DT_INT8, DT_STRING, "
             "DT_COMPLEX64, DT_INT64, DT_BOOL, DT_UINT16, DT_COMPLEX128, DT_HALF")


def error_of(data: bytes) -> str:
    with pytest.raises(RequestError) as info:
        codec.decode_request(data)
    assert info.value.status == 400
    return info.value.message


def test_count_mismatch() -> None:
    data = entry("x", array(1, [2, 3], length_delimited(3, struct.pack("<5f", *range(5)))))
    assert error_of(data) == "input 'x': shape [2, 3] needs 6 values, got 5"
    ids = entry("ids", array(9, [], length_delimited(7, varint(1) + varint(2))))
    assert error_of(ids) == "input 'ids': shape [] needs 1 values, got 2"
    pairs = entry("c", array(8, [2], length_delimited(3, struct.pack("<3f", 1, 2, 3))))
    assert error_of(pairs) == (
        "input 'c': shape [2] needs 4 values (2 complex numbers as real, imag pairs), got 3")


def test_values_in_the_wrong_field_count_as_missing() -> None:
    data = entry("ids", array(9, [2], length_delimited(5, varint(1) + varint(2))))
    assert error_of(data) == "input 'ids': shape [2] needs 2 values, got 0"


def test_unpacked_extra_value_after_packed_chunk() -> None:
    # Packed chunk with exactly the right count plus one unpacked value: 4 values, not 3.
    values = length_delimited(3, struct.pack("<3f", 1, 2, 3)) + key(3, 5) + struct.pack("<f", 4)
    assert error_of(entry("x", array(1, [3], values))) == "input 'x': shape [3] needs 3 values, got 4"


def test_bad_dtypes() -> None:
    assert error_of(entry("x", array(0, [1], b""))) == (
        f"input 'x': dtype is not set (DT_INVALID); supported: {SUPPORTED}")
    assert error_of(entry("x", array(14, [1], length_delimited(3, struct.pack("<f", 1))))) == (
        f"input 'x': dtype DT_BFLOAT16 is not supported; supported: {SUPPORTED}")
    assert error_of(entry("x", array(20, [1], b""))) == (
        f"input 'x': dtype DT_RESOURCE is not supported; supported: {SUPPORTED}")
    assert error_of(entry("x", array(42, [1], b""))) == (
        f"input 'x': unknown dtype 42; supported: {SUPPORTED}")


def test_negative_dimension() -> None:
    assert error_of(entry("x", array(9, [-1, 3], b""))) == (
        "input 'x': shape [-1, 3] has a negative dimension; dimensions must be >= 0")


def test_empty_shape_with_huge_dimensions() -> None:
    assert error_of(entry("x", array(9, [2**40, 2**30, 0], b""))) == (
        "input 'x': shape [1099511627776, 1073741824, 0] is too large: its non-zero "
        "dimensions multiply to more than 2147483647")
    largest = entry("x", array(9, [2**31 - 1, 0], b""))
    assert codec.decode_request(largest).inputs["x"].shape == (2**31 - 1, 0)
    assert codec._decode_message(largest).inputs["x"].shape == (2**31 - 1, 0)


def test_out_of_range_narrow_ints() -> None:
    data = entry("b", array(4, [2], length_delimited(5, varint(1) + varint(300))))
    assert error_of(data) == "input 'b': value 300 is out of range for DT_UINT8 [0, 255]"
    data = entry("s", array(6, [1], length_delimited(5, varint(-129))))
    assert error_of(data) == "input 's': value -129 is out of range for DT_INT8 [-128, 127]"


@pytest.mark.parametrize("data", [b"\x12\x05abc", b"\xff\xff\xff", b"\x12\x03\x0a\x01\xff"],
                         ids=["truncated", "bad-tag", "bad-utf8-key"])
def test_malformed_bytes(data: bytes) -> None:
    assert error_of(data).startswith(
        f"request is not a valid tensorflow.eas.PredictRequest ({len(data)} bytes): ")


def test_unsendable_numpy_dtypes() -> None:
    with pytest.raises(RequestError) as request_error:
        codec.encode_request({"u": np.array([1], dtype=np.uint64)})
    assert request_error.value.message.startswith(
        "input 'u': numpy dtype uint64 cannot be sent; supported: bool, complex128, complex64, ")
    with pytest.raises(InternalError) as output_error:
        codec.encode_response({"y": np.array([1], dtype=np.uint32)})
    assert output_error.value.message.startswith("output 'y': numpy dtype uint32 cannot be sent")
    with pytest.raises(RequestError, match="input 's': DT_STRING values must be str or bytes, got int"):
        codec.encode_request({"s": np.array([b"a", 5], dtype=object)})


# --- model info -------------------------------------------------------------------------------


def test_model_info_round_trip() -> None:
    data = codec.encode_model_info({
        "model_path": "/models/ckpt", "version": "v7", "global_step": 1200, "delta_step": 1250,
        "update_time": "2024-05-01T12:00:00Z", "signature_name": "serving_default",
        "ready": True, "last_error": None,
    })
    assert codec.decode_model_info(data) == {
        "model_path": "/models/ckpt", "model_version": "v7", "global_step": 1200,
        "delta_step": 1250, "update_time": 1714564800, "signature_name": "serving_default",
    }
    # A DeepRec client knows field 1 only and still reads it.
    assert data.startswith(length_delimited(1, b"/models/ckpt"))
    assert codec.decode_model_info(codec.encode_model_info({"update_time": 17.9}))["update_time"] == 17
    with pytest.raises(InternalError, match="model info cannot be encoded as ServingModelInfo"):
        codec.encode_model_info({"global_step": "many"})


def test_duplicate_keys_last_wins_on_both_paths() -> None:
    first = entry("x", array(9, [1], length_delimited(7, varint(1))))
    empty = entry("x", array(9, [0], b""))
    assert both_paths(first + empty).inputs["x"].shape == (0,)
    assert both_paths(empty + first).inputs["x"].tolist() == [1]


def test_mutated_requests_decode_the_same_on_both_paths() -> None:
    # Whatever the canonical path accepts must be exactly what the message path decodes;
    # whatever it rejects the message path rejects with the same text.
    rng = np.random.default_rng(7)
    base = codec.encode_request({
        "ids": np.array([3, 2**40, -5], dtype=np.int64), "x": np.ones((2, 2), np.float32),
        "n": np.array([1, 2], np.int8), "ok": np.array([True]),
    }, output_filter=["y"])
    accepted = 0
    for _ in range(600):
        data = bytearray(base)
        for _ in range(int(rng.integers(1, 3))):
            data[int(rng.integers(len(data)))] = int(rng.integers(256))
        try:
            codec._decode_message(bytes(data))
        except RequestError as exc:
            assert error_of(bytes(data)) == exc.message
            continue
        accepted += 1
        both_paths(bytes(data))
    assert accepted > 50
