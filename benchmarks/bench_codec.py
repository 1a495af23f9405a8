"""Request codec: decode a Criteo-shaped request (26 int64 id inputs + one float [B, 13])
natively against the pure-Python codec path, and encode a one-output response against plain
protobuf, all in the same run."""

from __future__ import annotations

import timeit
from collections.abc import Callable

import numpy as np

from benchmarks.report import Row
from recserve.proto import predict_pb2 as pb
from recserve.wire import codec

NOTES = """
Decode baseline: the pure-Python codec path (`RECSERVE_PURE_PYTHON=1`: one upb parse of a
flattened view plus a byte-for-byte rebuild check up to 32 KB, the generated
`PredictRequest` + `np.array` per input beyond). The native decoder is one C call
(native/codec.c, GIL released) plus, per layout of names/dtypes/shapes, cached numpy steps:
alike inputs come out of one reshape. Encode baseline: `PredictResponse` filled with
`float_val.extend` + `SerializeToString`; the codec writes float bytes directly.
Figures are the best of several repeats (the machine is shared). "speedup" = baseline
time / codec time. Hashed ids are full 64-bit values (9-10 byte varints), the worst case
for varint decoding.
"""

_WIRE = {pb.DT_FLOAT: ("float_val", np.float32), pb.DT_INT64: ("int64_val", np.int64)}


def criteo_request(batch: int, packed: bool = True) -> bytes:
    rng = np.random.default_rng(batch)
    ids = {f"C{i}": rng.integers(0, 2**63 - 1, batch, dtype=np.int64) for i in range(1, 27)}
    dense = rng.random((batch, 13), dtype=np.float32)
    if packed:
        return codec.encode_request({**ids, "dense": dense})
    # An old client writing the float input unpacked: one (tag, fixed32) per value. Map
    # entries concatenate, so the hand-written entry is simply appended.
    head = pb.ArrayProto(dtype=pb.DT_FLOAT, array_shape=pb.ArrayShape(dim=dense.shape)).SerializeToString()
    array = head + b"".join(b"\x1d" + v.tobytes() for v in dense.ravel())
    entry = b"\x0a\x05dense\x12" + _varint(len(array)) + array
    return codec.encode_request(ids) + b"\x12" + _varint(len(entry)) + entry


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def baseline_decode(data: bytes) -> dict[str, np.ndarray]:
    request = pb.PredictRequest.FromString(data)
    out = {}
    for name, proto in request.inputs.items():
        field, dtype = _WIRE[proto.dtype]
        out[name] = np.array(getattr(proto, field), dtype=dtype).reshape(tuple(proto.array_shape.dim))
    return out


def baseline_encode(outputs: dict[str, np.ndarray]) -> bytes:
    response = pb.PredictResponse()
    for name, value in outputs.items():
        proto = response.outputs[name]
        proto.dtype = pb.DT_FLOAT
        proto.array_shape.dim.extend(value.shape)
        proto.float_val.extend(value.ravel().tolist())
    return response.SerializeToString()


def best_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def _row(name: str, fn: Callable[[], object], base: Callable[[], object], number: int, goal_us: float | None) -> Row:
    # Repeats alternate between the two, so a slow spell of the shared machine hits both.
    times = [(best_us(fn, number), best_us(base, number)) for _ in range(3)]
    value, baseline = min(t for t, _ in times), min(b for _, b in times)
    return Row(
        name=name,
        value=f"{value:.1f} µs",
        baseline=f"{baseline:.1f} µs",
        ratio=baseline / value,
        goal=f"<= {goal_us:g} µs" if goal_us is not None else "",
        met=None if goal_us is None else value <= goal_us,
    )


def run() -> list[Row]:
    if codec._native is None:
        raise RuntimeError("bench_codec measures the native decoder; unset RECSERVE_PURE_PYTHON")
    rows = []
    for batch, number, goal in ((1, 2000, 15.0), (64, 500, None), (512, 100, 60.0)):
        data = criteo_request(batch)
        check = codec.decode_request(data).inputs
        assert all(np.array_equal(check[k], v) for k, v in baseline_decode(data).items())
        rows.append(_row(f"decode 27 inputs, batch {batch} ({len(data)} B): native vs pure-Python codec, speedup",
                         lambda d=data: codec.decode_request(d), lambda d=data: codec._decode_python(d), number, goal))
    old = criteo_request(1, packed=False)
    rows.append(_row("decode batch 1, float input unpacked (old client): native vs pure-Python codec, speedup",
                     lambda: codec.decode_request(old), lambda: codec._decode_python(old), 2000, None))
    for batch, number, goal in ((1, 5000, 5.0), (512, 2000, None)):
        outputs = {"prob": np.random.default_rng(0).random((batch, 1), dtype=np.float32)}
        assert codec.encode_response(outputs) == baseline_encode(outputs)
        rows.append(_row(f"encode 1 float32 output [{batch}, 1] vs plain protobuf, speedup",
                         lambda o=outputs: codec.encode_response(o), lambda o=outputs: baseline_encode(o), number, goal))
    return rows
