"""Arrays -> what the C request parser would have left for the equivalent PredictRequest
(native/codec.h): the *layout* bytes and one buffer of int64 value slots (string values as
(offset, length) spans into a second buffer). `Packing` is made once per request shape
(signature, output filter, input names, dtypes, shapes) and `checked` once against the
parser itself; recserve.processor.native_predict hands both to the native route.

Pure functions and immutable objects: thread-safe.
"""

from __future__ import annotations

import logging
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.wire import codec

__all__ = ["Packing", "checked", "packing", "request_bytes"]

log = logging.getLogger("recserve.processor")

_MAX_DIMS = 8           # RS_CODEC_MAX_DIMS

# numpy dtype -> RS_CODEC_OUT_* and how its values fill int64 slots: "i" one slot per value
# (varint fields), "f4"/"f8" their little-endian bytes.
_KINDS: dict[np.dtype[Any], tuple[int, str]] = {
    np.dtype(np.int64): (0, "i"), np.dtype(np.int32): (1, "i"), np.dtype(np.int16): (2, "i"),
    np.dtype(np.int8): (3, "i"), np.dtype(np.uint8): (4, "i"), np.dtype(np.uint16): (5, "i"),
    np.dtype(np.bool_): (6, "i"), np.dtype(np.float32): (7, "f4"), np.dtype(np.float64): (8, "f8"),
}
_OUT_STRING = 12
_I8, _F8 = np.dtype(np.int64), np.dtype(np.float64)
_PAD4 = b"\0\0\0\0"
_varint = codec._varint


def _text(s: str) -> bytes:
    raw = s.encode()
    return _varint(len(raw)) + raw


# How an input's values fill the buffer: its bytes as they are (int64, float64, float32 of
# an even count), float32 bytes and 4 bytes of padding (odd count: each input starts on a
# fresh slot), one int64 per value (narrower ints, bool), (offset, length) per string.
_RAW, _PAD, _WIDEN, _STRINGS = range(4)
_BYTES = {bytes}
_TEXT = {bytes, str}
_FEW = 32   # strings spanned in a Python loop; more with numpy


def _utf8(words: list[Any]) -> list[bytes] | None:
    """The strings' bytes (str as UTF-8); None when one is neither str nor bytes."""
    types = set(map(type, words))
    if types <= _BYTES:
        return words
    if not types <= _TEXT:
        return None
    return [w if type(w) is bytes else w.encode() for w in words]


def _spans(words: list[bytes], at: int) -> tuple[bytes, int]:
    """(start, length) of each word laid back to back from offset `at`, as int64 pairs, and
    the offset after the last."""
    if len(words) <= _FEW:
        flat: list[int] = []
        for word in words:
            flat += (at, len(word))
            at += len(word)
        return array("q", flat).tobytes(), at
    lengths = np.fromiter(map(len, words), _I8, len(words))
    spans = np.empty((len(words), 2), _I8)
    np.cumsum(lengths, out=spans[:, 0])
    end = at + int(spans[-1, 0])
    spans[:, 0] += at - lengths
    spans[:, 1] = lengths
    return spans.tobytes(), end


class Packing:
    """How one request shape becomes a layout and a values buffer."""

    __slots__ = ("layout", "raw", "steps")

    def __init__(self, layout: bytes, steps: tuple[int, ...]) -> None:
        self.layout = layout
        self.steps = steps      # per input, in order: _RAW, _PAD, _WIDEN or _STRINGS
        self.raw = all(step == _RAW for step in steps)

    def values(self, arrays: Sequence[np.ndarray]) -> tuple[bytes, bytes] | None:
        """(values buffer, string data) for `arrays`; None when a string is neither str nor bytes."""
        if self.raw:
            return b"".join([arr.tobytes() for arr in arrays]), b""
        parts: list[bytes] = []
        blob: list[bytes] = []
        at = 0
        for step, arr in zip(self.steps, arrays):
            if step == _RAW:
                parts.append(arr.tobytes())
            elif step == _PAD:
                parts.append(arr.tobytes() + _PAD4)
            elif step == _WIDEN:
                parts.append(arr.astype(_I8).tobytes())
            else:
                words = _utf8(arr.ravel().tolist())
                if words is None:
                    return None
                spans, at = _spans(words, at)
                blob.extend(words)
                parts.append(spans)
        return b"".join(parts), b"".join(blob)


def packing(signature_name: str, output_filter: Sequence[str], names: Sequence[str],
             arrays: Sequence[np.ndarray]) -> Packing | None:
    """The request shape's packing (see codec.h for the layout), or None: not one the native
    parser would take as it is."""
    layout = [_text(signature_name), _varint(len(output_filter)), *map(_text, output_filter), _varint(len(arrays))]
    steps = []
    slot = 0
    for name, arr in zip(names, arrays):
        if arr.ndim > _MAX_DIMS:
            return None
        count = arr.size
        if arr.dtype.kind in "OSU":
            out, step, slots = _OUT_STRING, _STRINGS, 2 * count
        else:
            kind = _KINDS.get(arr.dtype)
            if kind is None:
                return None
            out, how = kind
            if how == "f4":
                step, slots = (_PAD if count & 1 else _RAW), (count + 1) // 2
            else:
                step, slots = (_RAW if arr.dtype in (_I8, _F8) else _WIDEN), count
        layout += [_text(name), _varint(out), _varint(arr.ndim), *map(_varint, arr.shape), _varint(slot),
                   _varint(count)]
        steps.append(step)
        slot += slots
    return Packing(b"".join(layout), tuple(steps))


def _same_arrays(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> bool:
    if sorted(got) != sorted(want):
        return False
    for name, arr in want.items():
        mine = got[name]
        if mine.dtype != arr.dtype or mine.shape != arr.shape:
            return False
        if arr.dtype == np.dtype(object):
            if mine.ravel().tolist() != arr.ravel().tolist():
                return False
        elif not np.array_equal(mine, arr, equal_nan=True) or mine.tobytes() != arr.tobytes():
            return False
    return True


def _as_wire(arr: np.ndarray) -> np.ndarray:
    """`arr` as the parser gives it back: strings an object array of bytes (str as UTF-8)."""
    if arr.dtype.kind not in "OSU":
        return arr
    words = [w.encode() if isinstance(w, str) else w for w in arr.ravel().tolist()]
    out = np.empty(len(words), object)
    out[:] = words
    return out.reshape(arr.shape)


def request_bytes(signature_name: str, output_filter: Sequence[str], names: Sequence[str],
                   arrays: Sequence[np.ndarray]) -> bytes:
    return codec.encode_request(dict(zip(names, arrays)), signature_name, output_filter)


def checked(packing: Packing, signature_name: str, output_filter: Sequence[str], names: Sequence[str],
             arrays: Sequence[np.ndarray]) -> bool:
    """Whether the C parser, given these arrays as PredictRequest bytes, leaves the same layout
    and values as `packing` does, and arrays equal to these (a recserve bug otherwise: logged,
    and the shape stays in Python)."""
    try:
        parsed = codec.parse_request(request_bytes(signature_name, output_filter, names, arrays))
    except RecserveError:
        return False   # not encodable (encode_request says why; predict will too)
    if parsed is None:
        return False   # the parser declines it: so would rs_route_process
    packed = packing.values(arrays)
    if packed is None:
        return False
    values, data = packed
    from recserve.wire._codec_native import _arrays

    mine = np.frombuffer(values, _I8).copy()
    wire = parsed.inputs()
    given = {name: _as_wire(arr) for name, arr in zip(names, arrays)}
    if (parsed.layout != packing.layout or not _same_arrays(_arrays(mine, data, parsed.recipe), wire)
            or not _same_arrays(wire, given)):
        log.error("native predict: the packing of a request shape differs from the C parser's (a recserve bug); "
                  "requests of that shape take the Python route")
        return False
    return True
