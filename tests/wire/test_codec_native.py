"""The native request decoder against the generated parser: random requests in every legal
wire form (packed, unpacked, split chunks, any field order, unknown fields, repeated keys
and messages, every dtype) and randomly corrupted ones must give identical arrays or the
same RequestError message. Plus the C function's buffer contract and the switch."""

from __future__ import annotations

import ctypes
import math
import os
import random
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from recserve.errors import RequestError
from recserve.wire import codec

pytestmark = pytest.mark.skipif(codec._native is None, reason="the native decoder is off (RECSERVE_PURE_PYTHON=1)")

if codec._native is not None:
    from recserve.wire import _codec_native as native


def varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out + bytes([n]))


def key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def length_delimited(field: int, payload: bytes) -> bytes:
    return key(field, 2) + varint(len(payload)) + payload


def exact(a: np.ndarray) -> object:
    """The array's values, bit for bit except a NaN's payload: the message path passes floats
    through Python floats (doubles), which quiets signaling NaNs; the native path (like the
    canonical one) keeps the client's bits."""
    if a.dtype == object:
        return a.reshape(-1).tolist()
    if a.dtype.kind == "c":
        a = a.reshape(-1).view(a.real.dtype)
    if a.dtype.kind == "f":
        nan = np.isnan(a)
        return nan.tobytes(), np.where(nan, 0, a).tobytes()
    return a.tobytes()


def outcome(decode: object, data: bytes) -> tuple[object, ...]:
    try:
        decoded = decode(data)  # type: ignore[operator]
    except RequestError as exc:
        return ("error", exc.message)
    arrays = sorted((name, a.dtype.str, a.shape, exact(a)) for name, a in decoded.inputs.items())
    return ("ok", decoded.signature_name, decoded.output_filter, arrays)


def assert_same(data: bytes) -> bool:
    """decode_request (native) == the generated parser's decode; True if native decoded it."""
    assert outcome(codec.decode_request, data) == outcome(codec._decode_message, data)
    return native.decode(data) is not None


# --- random requests ---------------------------------------------------------------------

_FIELD = {1: 3, 2: 4, 3: 5, 4: 5, 5: 5, 6: 5, 7: 6, 8: 3, 9: 7, 10: 8, 17: 5, 18: 4, 19: 3}
_NARROW = {4: (0, 255), 5: (-32768, 32767), 6: (-128, 127), 17: (0, 65535)}
_ODD_DTYPES = [0, 11, 14, 20, 42, -3, 2**32 + 9]
_NAMES = ["ids", "x", "C1", "dense", "", "\u00fc\u00df", "a:0"]


class Requests:
    """Random PredictRequest bytes in every legal wire form. One per test; not thread-safe."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.declined = False   # the last request has a form the native decoder leaves to upb

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def unknown_field(self) -> bytes:
        field = self.rng.choice([9, 15, 100, 5000])
        kind = self.rng.choice([0, 1, 2, 5])
        payload = {0: varint(self.rng.getrandbits(64)), 1: os.urandom(8), 5: os.urandom(4),
                   2: varint(3) + b"abc"}[kind]
        return key(field, kind) + payload

    def scalar(self, field: int, dtype: int) -> bytes:
        """One value as it travels inside a packed chunk (varint or fixed bytes)."""
        r = self.rng
        if field == 3:
            return os.urandom(4) if self.chance(0.2) else struct.pack("<f", r.uniform(-1e4, 1e4))
        if field == 4:
            return os.urandom(8) if self.chance(0.2) else struct.pack("<d", r.uniform(-1e9, 1e9))
        if field == 8:
            return varint(r.choice([0, 1, 1, 2, 2**40]))
        low, high = _NARROW.get(dtype, (-(2**31), 2**31 - 1))
        if field == 7 or self.chance(0.05):   # ids; or an int_val beyond its type (truncated / rejected)
            return varint(r.choice([r.getrandbits(64), r.randrange(300), -r.randrange(1, 1000)]))
        return varint(r.randint(low, high))

    def values(self, field: int, dtype: int, count: int) -> list[bytes]:
        """`count` values of `field`, each wire chunk encoded packed, split or unpacked."""
        if field == 6:
            return [length_delimited(6, os.urandom(self.rng.randrange(4))) for _ in range(count)]
        items = [self.scalar(field, dtype) for _ in range(count)]
        single = {3: 5, 4: 1}.get(field, 0)
        style = self.rng.choice(["packed", "packed", "split", "unpacked", "mixed"])
        if style == "packed":
            return [length_delimited(field, b"".join(items))] if items or self.chance(0.5) else []
        chunks: list[bytes] = []
        i = 0
        while i < len(items):
            n = self.rng.randint(1, 3)
            if style == "unpacked" or (style == "mixed" and self.chance(0.5)):
                chunks.extend(key(field, single) + v for v in items[i:i + n])
            else:
                chunks.append(length_delimited(field, b"".join(items[i:i + n])))
            i += n
        return chunks

    def array(self) -> list[bytes]:
        """An ArrayProto as a list of field pieces (callers may shuffle or split them)."""
        r = self.rng
        dtype = r.choice(list(_FIELD)) if self.chance(0.9) else r.choice(_ODD_DTYPES)
        ndims = r.choice([0, 1, 1, 2, 2, 3]) if self.chance(0.97) else 9
        dims = [r.choice([0, 1, 2, 3]) for _ in range(ndims)]
        if self.chance(0.03):
            dims[0:1] = [-1]
        if self.chance(0.02):
            dims = [r.choice([2**31 - 1, 2**31, 2**62]), 2, 0][:r.randint(1, 3)]
        self.declined |= len(dims) > 8
        count = math.prod(dims) * (2 if dtype in (8, 18) else 1)
        if count > 1000:
            count = r.randrange(3)
        if self.chance(0.05):
            count += r.choice([-1, 1])
        field = _FIELD.get(dtype, r.choice([3, 5, 7]))
        pieces = [key(1, 0) + varint(dtype)] if dtype or self.chance(0.5) else []
        if self.chance(0.1):   # an earlier dtype the later one overrides
            pieces.insert(0, key(1, 0) + varint(r.choice(list(_FIELD))))
        dim_bytes = [varint(d) for d in dims]
        cut = r.randint(0, len(dims))
        if self.chance(0.2):   # two array_shape messages merge; dims unpacked in the second
            pieces.append(length_delimited(2, length_delimited(1, b"".join(dim_bytes[:cut]))))
            pieces.append(length_delimited(2, b"".join(key(1, 0) + d for d in dim_bytes[cut:])))
        elif dims or self.chance(0.8):
            pieces.append(length_delimited(2, length_delimited(1, b"".join(dim_bytes))))
        pieces += self.values(field, dtype, max(count, 0))
        if self.chance(0.1):   # values in a field the dtype does not read
            other = r.choice([f for f in (3, 4, 5, 6, 7, 8) if f != field])
            pieces += self.values(other, 9, r.randint(0, 3))
        if self.chance(0.15):
            pieces.insert(r.randrange(len(pieces) + 1), self.unknown_field())
        if self.chance(0.3):
            r.shuffle(pieces)
        return pieces

    def entry(self) -> bytes:
        r = self.rng
        name = r.choice(_NAMES).encode()
        if self.chance(0.02):
            name = b"\xff" + name
        pieces = self.array()
        if len(pieces) > 1 and self.chance(0.15):   # one entry, its value in two messages (merged)
            cut = r.randrange(1, len(pieces))
            values = [length_delimited(2, b"".join(pieces[:cut])), length_delimited(2, b"".join(pieces[cut:]))]
        else:
            values = [length_delimited(2, b"".join(pieces))]
        fields = ([length_delimited(1, name)] if self.chance(0.97) else []) + values
        if self.chance(0.2):
            r.shuffle(fields)
        if self.chance(0.03):   # upb keeps an entry with an unknown field out of the map
            fields.append(self.unknown_field())
            self.declined = True
        return length_delimited(2, b"".join(fields))

    def request(self) -> bytes:
        r = self.rng
        self.declined = False
        pieces = [self.entry() for _ in range(r.randint(0, 5))]
        if self.chance(0.7):
            pieces.insert(0, length_delimited(1, r.choice([b"serving_default", b"", b"sig\xc3\xa9", b"bad\xed\xa0\x80"])))
        pieces += [length_delimited(3, r.choice([b"prob", b"y", "\u00e9".encode()])) for _ in range(r.randint(0, 2))]
        if self.chance(0.2):
            pieces.insert(r.randrange(len(pieces) + 1), self.unknown_field())
        if self.chance(0.3):
            r.shuffle(pieces)
        return b"".join(pieces)

    def corrupt(self, data: bytes) -> bytes:
        r = self.rng
        out = bytearray(data)
        for _ in range(r.randint(1, 3)):
            what = r.choice(["flip", "truncate", "insert"])
            if what == "flip" and out:
                out[r.randrange(len(out))] = r.randrange(256)
            elif what == "truncate" and out:
                del out[r.randrange(len(out)):]
            else:
                out.insert(r.randrange(len(out) + 1), r.randrange(256))
        return bytes(out)


# float_val values beyond float16 range become inf for DT_HALF on both paths, with numpy's warning.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_random_requests_decode_like_the_generated_parser() -> None:
    requests = Requests(seed=20240501)
    ok = 0
    for _ in range(4000):
        data = requests.request()
        natively = assert_same(data)
        if outcome(codec._decode_message, data)[0] == "ok":
            ok += 1
            # Every valid request decodes natively but for the forms it documents leaving to upb.
            assert natively != requests.declined, data.hex()
    assert ok > 1000


# float_val values beyond float16 range become inf for DT_HALF on both paths, with numpy's warning.
@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_corrupted_requests_fail_or_decode_like_the_generated_parser() -> None:
    requests = Requests(seed=7)
    errors = 0
    for _ in range(4000):
        data = requests.corrupt(requests.request())
        assert_same(data)
        errors += outcome(codec._decode_message, data)[0] == "error"
    assert errors > 1000


# --- the forms old clients write decode natively --------------------------------------------


def array(dtype: int, dims: list[int], values: bytes) -> bytes:
    return key(1, 0) + varint(dtype) + length_delimited(2, length_delimited(1, b"".join(map(varint, dims)))) + values


def entry(name: str, array_bytes: bytes) -> bytes:
    return length_delimited(2, length_delimited(1, name.encode()) + length_delimited(2, array_bytes))


NATIVE_FORMS = {
    "unpacked floats": entry("x", array(1, [2], key(3, 5) + struct.pack("<f", 1.5) + key(3, 5) + struct.pack("<f", -2))),
    "unpacked doubles": entry("x", array(2, [1], key(4, 1) + struct.pack("<d", 0.1))),
    "unpacked ids": entry("ids", array(9, [3], b"".join(key(7, 0) + varint(v) for v in (1, -1, 2**63 - 1)))),
    "split packed chunks": entry("ids", array(9, [3], length_delimited(7, varint(5)) + length_delimited(7, varint(6) + varint(7)))),
    "values before dtype and shape": entry("x", length_delimited(3, struct.pack("<2f", 1, 2)) + key(1, 0) + varint(1)
                                           + length_delimited(2, length_delimited(1, varint(2)))),
    "value before key": length_delimited(2, length_delimited(2, array(9, [1], length_delimited(7, varint(3))))
                                         + length_delimited(1, b"k")),
    "duplicate keys": entry("x", array(9, [1], length_delimited(7, varint(1)))) + entry("x", array(1, [0], b"")),
    "unknown fields everywhere": key(99, 0) + varint(5) + entry("x", key(20, 2) + varint(1) + b"z" + array(
        9, [2], length_delimited(7, varint(1) + varint(2)))) + key(7, 5) + b"abcd",
    "unknown field in the shape": entry("x", key(1, 0) + varint(9) + length_delimited(2, key(3, 0) + varint(1) + key(1, 0) + varint(1))
                                        + length_delimited(7, varint(4))),
    "value message twice (merged)": length_delimited(2, length_delimited(1, b"x") + length_delimited(2, key(1, 0) + varint(9))
                                                     + length_delimited(2, length_delimited(2, length_delimited(1, varint(1)))
                                                                        + length_delimited(7, varint(8)))),
    "10-byte varints with high bits": entry("ids", array(9, [2], length_delimited(7, b"\xff" * 9 + b"\x7f" + b"\x80" * 9 + b"\x01"))),
    "int_val truncated to int32": entry("n", array(3, [2], length_delimited(5, varint(2**32 + 5) + varint(-7)))),
    "bool values other than 1": entry("b", array(10, [3], length_delimited(8, varint(0) + varint(2) + varint(2**40)))),
    "strings": entry("s", array(7, [2], length_delimited(6, b"ab") + length_delimited(6, b""))),
    "overlong tag and length": b"\x8a\x80\x80\x80\x00" + varint(1) + b"s" + b"\x1a\x81\x00" + b"y",
}


@pytest.mark.parametrize("data", NATIVE_FORMS.values(), ids=NATIVE_FORMS.keys())
def test_legal_forms_decode_natively(data: bytes) -> None:
    assert assert_same(data)


DECLINED = {
    "unknown field in a map entry": length_delimited(2, length_delimited(1, b"x") + key(3, 0) + varint(1)),
    "group": key(100, 3) + key(100, 4),
    "nine dimensions": entry("x", array(9, [1] * 9, length_delimited(7, varint(1)))),
    "bad utf-8 key": length_delimited(2, length_delimited(1, b"\xff") + length_delimited(2, array(9, [0], b""))),
    "bad utf-8 in a superseded signature_name": length_delimited(1, b"\xed\xa0\x80") + length_delimited(1, b"ok"),
}


@pytest.mark.parametrize("data", DECLINED.values(), ids=DECLINED.keys())
def test_unusual_forms_are_left_to_the_generated_parser(data: bytes) -> None:
    assert not assert_same(data)


def overlong(n: int, width: int) -> bytes:
    """n as a varint padded to `width` bytes (0x80 continuation bytes)."""
    out = [(n >> (7 * i)) & 0x7F | (0x80 if i < width - 1 else 0) for i in range(width)]
    return bytes(out)


# Lengths written in more than five varint bytes: upb refuses the message (RELIABILITY.md,
# finding 3, found by the codec_parity fuzzer), and so must the native decoder.
OVERLONG = {
    "output_filter (the fuzzer's input)": bytes.fromhex("1a001a8080808080808080001a00"),
    "signature_name": key(1, 2) + overlong(2, 6) + b"ok",
    "inputs entry": key(2, 2) + overlong(0, 10),
    "key of an entry": length_delimited(2, key(1, 2) + overlong(1, 7) + b"x"),
    "packed values": entry("x", array(9, [2], key(7, 2) + overlong(2, 6) + varint(1) + varint(2))),
}


@pytest.mark.parametrize("data", OVERLONG.values(), ids=OVERLONG.keys())
def test_overlong_lengths_are_refused_like_the_generated_parser(data: bytes) -> None:
    assert not assert_same(data)
    assert outcome(codec.decode_request, data)[0] == "error"


def test_five_byte_lengths_still_decode() -> None:
    data = key(1, 2) + overlong(2, 5) + b"ok" + entry("x", array(9, [1], length_delimited(7, varint(7))))
    assert assert_same(data)


def test_many_inputs_grow_the_scratch() -> None:
    inputs = {f"f{i}": np.array([i, -i], np.int64) for i in range(2000)}
    data = codec.encode_request(inputs)
    assert assert_same(data)
    decoded = codec.decode_request(data).inputs
    assert all(decoded[k].tolist() == v.tolist() for k, v in inputs.items())


def test_threads_decode_concurrently() -> None:
    requests = [codec.encode_request({f"f{i}": np.arange(n, dtype=np.int64) + i for i in range(n)}) for n in range(1, 40)]
    expected = [outcome(codec._decode_message, data) for data in requests]

    def work(offset: int) -> bool:
        return all(outcome(codec.decode_request, requests[(offset + k) % len(requests)])
                   == expected[(offset + k) % len(requests)] for k in range(300))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(work, range(4)))


def test_arrays_are_private_to_their_request() -> None:
    data = codec.encode_request({"a": np.arange(3), "b": np.ones((2, 2), np.float32)})
    first = codec.decode_request(data).inputs
    first["a"][:] = 9
    assert codec.decode_request(data).inputs["a"].tolist() == [0, 1, 2]
    assert first["b"].flags.c_contiguous and first["b"].flags.aligned


def test_buffer_too_small_is_a_status_not_an_overflow() -> None:
    data = codec.encode_request({"ids": np.arange(50, dtype=np.int64), "s": np.array([b"x"] * 5, dtype=object)})
    values = np.zeros(len(data) + 1, np.int64)
    scratch = np.zeros(4096, np.int64)

    def call(values_cap: int, scratch_cap: int) -> int:
        return int(native._decode_request(data, len(data), values.ctypes.data, values_cap, scratch.ctypes.data, scratch_cap))

    assert call(4, 4096) == -2   # RS_CODEC_VALUES_FULL
    assert not values[4:].any()
    scratch[:] = 0
    assert call(len(values), 20) == -3   # RS_CODEC_SCRATCH_FULL: one entry's row fits, not two
    assert not scratch[20:].any()
    assert call(len(values), 4096) > 0
    assert values[:50].tolist() == list(range(50))


def test_empty_and_non_bytes_input() -> None:
    assert native.decode(b"") == ("", {}, ())
    data = codec.encode_request({"a": np.arange(2)})
    assert codec.decode_request(bytearray(data)).inputs["a"].tolist() == [0, 1]
    assert codec.decode_request(memoryview(data)).inputs["a"].tolist() == [0, 1]


def test_environment_variable_selects_the_python_decoder() -> None:
    code = "from recserve.wire import codec; print(codec._native is None)"
    for value, expected in (("1", "True"), ("", "False")):
        env = dict(os.environ, RECSERVE_PURE_PYTHON=value)
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        assert done.stdout.strip() == expected


def test_library_declares_its_function() -> None:
    function = native._decode_request
    assert function.restype is ctypes.c_int64
    assert len(function.argtypes) == 6
