"""PredictRequest decoding in C (native/codec.h) through ctypes.

One C call parses the whole request into a fresh int64 buffer of values plus a *layout*:
everything about the result except the values (names, dtypes, shapes, where each input's
values start). Requests from one client repeat the same layout, so the layout's bytes key
a cache of recipes: the few numpy steps (views, and a cast for narrow ints, bool and half)
that turn the buffer into the arrays. Inputs alike in dtype and shape whose values lie
back to back (the usual [B] id inputs) come out of one reshape as rows of one block.

`decode` returns None whenever the C side declines (anything unusual or invalid); the
caller then parses with the generated code, which owns every error message.

Thread-safe: ctypes.CDLL releases the GIL during the parse; scratch space is per thread;
the recipe cache is a dict whose races only cost a recomputation.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple, cast

import numpy as np

from recserve.native_library import open_library

_SCRATCH_FULL = 3   # RS_CODEC_SCRATCH_FULL; every other failure goes to the generated parser
_SCRATCH_START, _SCRATCH_MAX = 1 << 12, 1 << 20   # int64 slots; beyond: the generated parser
_CACHE_LIMIT = 8192


_DECODE = (ctypes.c_int64, [ctypes.c_char_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64,
                            ctypes.c_void_p, ctypes.c_int64])
_lib = open_library(Path(__file__).with_name("librecserve_codec.so"), "codec",
                    {"rs_decode_request": _DECODE, "rs_decode_tfs_request": _DECODE})
_decode_request = _lib.rs_decode_request
_decode_tfs_request = _lib.rs_decode_tfs_request
_VALUES_FULL = 2   # RS_CODEC_VALUES_FULL: only a TF Serving request whose values repeat to fill
TFS_MAX_FILL = 1 << 20   # RS_CODEC_TFS_MAX_FILL
_char_at = ctypes.c_char.from_buffer


def _address(a: np.ndarray) -> int:
    # ctypes.from_buffer is several times faster than ndarray.ctypes.data.
    return ctypes.addressof(_char_at(cast(Any, a)))


# RS_CODEC_OUT_* -> (array dtype, dtype of the values in the buffer). Varint fields fill one
# int64 per value; float_val/double_val keep their little-endian bytes.
_I8, _F4, _F8 = np.dtype(np.int64), np.dtype("<f4"), np.dtype("<f8")
_OUT: tuple[tuple[np.dtype[Any], np.dtype[Any]], ...] = (
    *((np.dtype(t), _I8) for t in (np.int64, np.int32, np.int16, np.int8, np.uint8, np.uint16, np.bool_)),
    (np.dtype(np.float32), _F4), (np.dtype(np.float64), _F8), (np.dtype(np.float16), _F4),
    (np.dtype(np.complex64), _F4), (np.dtype(np.complex128), _F8),
)
_STRING = len(_OUT)

# (values, request bytes) -> the arrays of a run of inputs, in order (iterating a 2-D block
# yields its rows as views).
_Step = Callable[[np.ndarray, bytes], Iterable[np.ndarray]]


@dataclass(frozen=True, slots=True)
class WireInput:
    """Where one input of a decoded request sits in the values buffer. Immutable."""

    name: str
    out: int
    dims: tuple[int, ...]
    slot: int
    count: int   # wire values

    @property
    def int64_values(self) -> bool:
        """Whether values[slot:slot + count] are the input's values as int64 (integer and
        bool inputs, widened: what a safe cast to int64 of the array gives)."""
        return self.out != _STRING and _OUT[self.out][1] is _I8

    def reader(self) -> Callable[[np.ndarray, bytes], np.ndarray]:
        """(values, request bytes) -> this input's array, as `decode` gives it."""
        if self.out != _STRING:
            return _array_reader(self, 1)
        step = _string_step(self)
        return lambda values, data: next(iter(step(values, data)))

    @property
    def slots(self) -> int:
        if self.out == _STRING:
            return 2 * self.count
        return -(-self.count * _OUT[self.out][1].itemsize // 8)

    def follows(self, prev: WireInput) -> bool:
        """Same dtype and shape, values right after prev's, no padding between: one block."""
        return (self.out == prev.out != _STRING and self.dims == prev.dims and
                self.slot == prev.slot + prev.slots and prev.slots * 8 == prev.count * _OUT[prev.out][1].itemsize)


@dataclass(frozen=True, slots=True)
class Recipe:
    """How the values of one layout become the request's arrays. Immutable."""

    signature_name: str
    output_filter: tuple[str, ...]
    inputs: tuple[WireInput, ...]
    steps: tuple[tuple[tuple[str, ...], _Step], ...]   # (input names, their arrays)


def _array_reader(first: WireInput, rows: int) -> Callable[[np.ndarray, bytes], np.ndarray]:
    """The array of `first` (rows 1), or the [rows, ...] block of it and the inputs after it."""
    out, wire = _OUT[first.out]
    start, stop, total = first.slot, first.slot + rows * first.slots, rows * first.count
    shape = (rows, *first.dims) if rows > 1 else first.dims
    cast_to = out if out.kind in "iub" and out != wire or out == np.float16 else None
    view_as = out if out.kind == "c" else None

    def read(values: np.ndarray, data: bytes) -> np.ndarray:
        flat = values[start:stop]
        if wire is not _I8:
            flat = flat.view(wire)[:total]
        if cast_to is not None:
            flat = flat.astype(cast_to)
        elif view_as is not None:
            flat = flat.view(view_as)
        return flat.reshape(shape)
    return read


def _array_step(first: WireInput, rows: int) -> _Step:
    read = _array_reader(first, rows)
    if rows > 1:
        return read
    return lambda values, data: (read(values, data),)


def _string_step(first: WireInput) -> _Step:
    start, stop, count, dims = first.slot, first.slot + 2 * first.count, first.count, first.dims

    def step(values: np.ndarray, data: bytes) -> Iterable[np.ndarray]:
        pairs = values[start:stop].tolist()
        strings = np.empty(count, dtype=object)
        strings[:] = [data[at:at + n] for at, n in zip(pairs[0::2], pairs[1::2])]
        return (strings.reshape(dims),)
    return step


class _LayoutReader:
    """Reads a layout's varints and texts from `at` on. Used by one thread."""

    __slots__ = ("at", "data")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def number(self) -> int:
        value = shift = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                return value

    def text(self) -> str:
        n = self.number()
        self.at += n
        return self.data[self.at - n:self.at].decode()   # the C side checked it is UTF-8


def _recipe(layout: bytes) -> Recipe:
    reader = _LayoutReader(layout)
    number, text = reader.number, reader.text
    signature_name = text()
    output_filter = tuple(text() for _ in range(number()))
    inputs = []
    for _ in range(number()):
        name, out = text(), number()
        dims = tuple(number() for _ in range(number()))
        inputs.append(WireInput(name, out, dims, number(), number()))
    steps = []
    i = 0
    while i < len(inputs):
        first, rows = inputs[i], 1
        while i + rows < len(inputs) and inputs[i + rows].follows(inputs[i + rows - 1]):
            rows += 1
        names = tuple(x.name for x in inputs[i:i + rows])
        steps.append((names, _string_step(first) if first.out == _STRING else _array_step(first, rows)))
        i += rows
    return Recipe(signature_name, output_filter, tuple(inputs), tuple(steps))


_recipes: dict[bytes, Recipe] = {}


class _Scratch:
    """One thread's working space for the C parser. Used by its own thread only."""

    __slots__ = ("address", "array", "bytes", "cap")

    def __init__(self, cap: int) -> None:
        self.array = np.empty(cap, np.int64)
        self.address = _address(self.array)
        self.cap = cap
        self.bytes = self.array.data.cast("B")


_local = threading.local()


class ParsedRequest(NamedTuple):
    """A request as the C parser left it: one fresh int64 buffer of values (writeable, not
    shared) and the recipe of its layout; `layout` (bytes) keys anything cached per layout."""

    values: np.ndarray
    data: bytes
    layout: bytes
    recipe: Recipe

    def inputs(self) -> dict[str, np.ndarray]:
        """{name: array}, views of `values`."""
        return _arrays(self.values, self.data, self.recipe)


def _arrays(values: np.ndarray, data: bytes, recipe: Recipe) -> dict[str, np.ndarray]:
    inputs: dict[str, np.ndarray] = {}
    for names, step in recipe.steps:
        inputs.update(zip(names, step(values, data)))
    return inputs


def _run(decoder: Any, data: bytes, values: np.ndarray) -> tuple[int, _Scratch]:
    size = len(data)
    try:
        scratch = _local.scratch
    except AttributeError:
        scratch = _local.scratch = _Scratch(_SCRATCH_START)
    got = decoder(data, size, _address(values), len(values), scratch.address, scratch.cap)
    while got == -_SCRATCH_FULL and scratch.cap < _SCRATCH_MAX:
        scratch = _local.scratch = _Scratch(scratch.cap * 4)
        got = decoder(data, size, _address(values), len(values), scratch.address, scratch.cap)
    return got, scratch


def _parse(data: bytes) -> tuple[np.ndarray, bytes, Recipe] | None:
    values = np.empty(len(data) + 1, np.int64)   # the C side's bound: one slot per wire byte
    got, scratch = _run(_decode_request, data, values)
    if got < 0:
        return None
    return values, *_layout_recipe(scratch.bytes[:got].tobytes())


def _layout_recipe(layout: bytes) -> tuple[bytes, Recipe]:
    recipe = _recipes.get(layout)
    if recipe is None:
        if len(_recipes) >= _CACHE_LIMIT:
            _recipes.clear()
        recipe = _recipes[layout] = _recipe(layout)
    return layout, recipe


def parse(data: bytes) -> ParsedRequest | None:
    """The parsed request, or None to leave `data` to the generated parser."""
    parsed = _parse(data)
    return None if parsed is None else ParsedRequest(parsed[0], data, parsed[1], parsed[2])


def decode(data: bytes) -> tuple[str, dict[str, np.ndarray], tuple[str, ...]] | None:
    """(signature_name, inputs, output_filter), or None to leave `data` to the generated parser.
    Arrays are views of one fresh buffer per request (writeable, not shared)."""
    parsed = _parse(data)
    if parsed is None:
        return None
    values, _, recipe = parsed
    return recipe.signature_name, _arrays(values, data, recipe), recipe.output_filter


def _model_spec(prefix: bytes) -> tuple[tuple[str, int | None, str | None], int]:
    """The prefix's (name, version, version_label) and where the layout after it starts."""
    reader = _LayoutReader(prefix)
    name, kind = reader.text(), reader.number()
    version = label = None
    if kind == 1:
        version = reader.number()
        version = version - (1 << 64) if version >= 1 << 63 else version
    elif kind == 2:
        label = reader.text()
    return (name, version, label), reader.at


# prefix + layout bytes -> (ModelSpec, layout, recipe): a client repeats both.
_tfs_layouts: dict[bytes, tuple[tuple[str, int | None, str | None], bytes, Recipe]] = {}


def parse_tfs(data: bytes) -> tuple[tuple[str, int | None, str | None], ParsedRequest] | None:
    """A tensorflow.serving.PredictRequest's ModelSpec (name, version, version_label; the
    signature_name is the recipe's) and its inputs parsed as `parse` parses an EAS request
    (the same layouts and recipes), or None to leave `data` to recserve.wire.tfserving_codec."""
    values = np.empty(len(data) + 1, np.int64)
    got, scratch = _run(_decode_tfs_request, data, values)
    if got == -_VALUES_FULL:   # values repeated to fill a tensor: the bound codec.h gives
        values = np.empty(2 * (len(data) + 1) + 2 * TFS_MAX_FILL, np.int64)
        got, scratch = _run(_decode_tfs_request, data, values)
    if got < 0:
        return None
    whole = scratch.bytes[:got].tobytes()
    known = _tfs_layouts.get(whole)
    if known is None:
        spec, at = _model_spec(whole)
        known = (spec, *_layout_recipe(whole[at:]))
        if len(_tfs_layouts) >= _CACHE_LIMIT:
            _tfs_layouts.clear()
        _tfs_layouts[whole] = known
    spec, layout, recipe = known
    return spec, ParsedRequest(values, data, layout, recipe)
