"""`Processor.predict` on the native request route (native/route_values.inc, DESIGN §10).

The KServe v2 and TF Serving REST handlers call `predict` with arrays they parsed from JSON.
Instead of the Python route, those arrays go to the same compiled routes
`Processor.process` uses, handed over as the C parser would have left the equivalent
PredictRequest: its *layout* bytes (native/codec.h) and one buffer of values, packed with a
few numpy steps. The response comes back as PredictResponse bytes, read into arrays by a
plan cached per layout (float and double outputs) or by the generated parser.

Soundness. A layout's plan (`_Packing`) is made once per request shape (signature, input
names, dtypes, shapes, output filter) and checked then against the C parser itself: the
request encoded (`codec.encode_request`) and parsed must give the same layout, and its
recipe must read the same arrays out of our values as out of the parser's. Equal layout
bytes then mean the route answers what `Processor.process` would for those bytes, which the
native route's tests hold equal to the Python route. Anything else -- a dtype the wire has
no kind for (uint32, float16 fed natively, ...), a string that is neither str nor bytes, a
layout with no route, an output the native encoder does not write, any error -- returns None and
`Processor.predict` takes the Python route, which owns every error message.

Thread-safe: the caches are dicts whose races only cost a recomputation; per-thread out
parameters.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import weakref
from array import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.errors import RecserveError
from recserve.processor import native_route
from recserve.wire import codec

if TYPE_CHECKING:
    from recserve.processor.manager import ServableManager
    from recserve.processor.servable import Servable
    from recserve.processor.trace import RequestTrace

__all__ = ["NativePredict"]

log = logging.getLogger("recserve.processor")

_ROUTE_MISS = native_route.FALLBACK_REASONS.index("route_miss")
_INFO_REASON = 7        # RS_INFO_REASON
_MAX_DIMS = 8           # RS_CODEC_MAX_DIMS
_CACHE_LIMIT = 1024     # request shapes (and layouts tried per version) remembered

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


class _Packing:
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


def _packing(signature_name: str, output_filter: Sequence[str], names: Sequence[str],
             arrays: Sequence[np.ndarray]) -> _Packing | None:
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
    return _Packing(b"".join(layout), tuple(steps))


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


def _request_bytes(signature_name: str, output_filter: Sequence[str], names: Sequence[str],
                   arrays: Sequence[np.ndarray]) -> bytes:
    return codec.encode_request(dict(zip(names, arrays)), signature_name, output_filter)


def _checked(packing: _Packing, signature_name: str, output_filter: Sequence[str], names: Sequence[str],
             arrays: Sequence[np.ndarray]) -> bool:
    """Whether the C parser, given these arrays as PredictRequest bytes, leaves the same layout
    and values as `packing` does, and arrays equal to these (a recserve bug otherwise: logged,
    and the shape stays in Python)."""
    try:
        parsed = codec.parse_request(_request_bytes(signature_name, output_filter, names, arrays))
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


def _varint_at(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7


def _read_any(response: bytes) -> dict[str, np.ndarray]:
    """Any PredictResponse the native encoder writes, as arrays in its entries' order (the
    order of the request's outputs): the generated parser reads the values, a walk over the
    entries' heads the order (a protobuf map has none of its own). Each entry's key comes
    first (native/route.c, put_output)."""
    decoded = codec.decode_response(response)
    ordered, at = {}, 0
    while at < len(response):
        length, at = _varint_at(response, at + 1)
        key_length, start = _varint_at(response, at + 1)
        key = response[start:start + key_length].decode()
        ordered[key] = decoded[key]
        at += length
    return ordered


class _Outputs:
    """Reads one layout's PredictResponse bytes into arrays without the generated parser: the
    (name, dtype, shape) of each output as the first response had them, each a float or
    double array (its values are the bytes after a fixed head: codec._entry_prefix). Later
    responses are checked to have the same heads at the same places."""

    __slots__ = ("entries", "size")

    def __init__(self, entries: tuple[tuple[str, bytes, int, np.dtype[Any], tuple[int, ...], int], ...],
                 size: int) -> None:
        self.entries = entries   # (key, head, its offset, dtype, shape, element count)
        self.size = size

    @classmethod
    def plan(cls, response: bytes) -> _Outputs | None:
        """The plan for responses like `response`; None when an output is not a non-empty float
        or double array (those responses are read by `_read_any`)."""
        decoded = _read_any(response)
        entries, at = [], 0
        for key, arr in decoded.items():
            head = codec._entry_prefix(key, arr)
            if head is None or head[1] != arr.dtype or not response.startswith(head[0], at):
                return None
            entries.append((key, head[0], at, arr.dtype, arr.shape, arr.size))
            at += len(head[0]) + arr.nbytes
        plan = cls(tuple(entries), len(response))
        read = plan.read(response)
        if read is None or list(read) != list(decoded) or any(
                read[k].shape != decoded[k].shape or read[k].tobytes() != decoded[k].tobytes() for k in decoded):
            return None
        return plan

    def read(self, response: bytes) -> dict[str, np.ndarray] | None:
        if len(response) != self.size:
            return None
        outputs = {}
        for key, head, at, dtype, shape, count in self.entries:
            if not response.startswith(head, at):
                return None
            # A copy: aligned and writeable, as the Python route's arrays are.
            outputs[key] = np.frombuffer(response, dtype, count, at + len(head)).reshape(shape).copy()
        return outputs


def _fill_trace(trace: RequestTrace, info: np.ndarray) -> None:
    """The stages `Servable.predict` traces, "lookup" and "run" (the response's encoding in C
    counted with the run); the caller traces its own decode and encode."""
    from recserve.processor.trace import Span

    servable_id, batch, t0, _, t2, _, t4, _ = info.tolist()   # RS_INFO_* (route.h)
    version, ref = native_route._served_by.get(servable_id, ("", native_route._no_servable))
    servable = ref()
    trace.model_version = version
    trace.delta_step = servable.delta_step if servable is not None else 0
    trace.batch_size = batch
    trace.spans.extend((Span("lookup", t0, t2), Span("run", t2, t4)))


class _Call:
    """One thread's out-parameters of rs_route_process_values."""

    __slots__ = ("info", "info_address", "out", "out_ref", "size", "size_ref")

    def __init__(self) -> None:
        self.info = np.zeros(_INFO_REASON + 1, np.int64)
        self.info_address = self.info.ctypes.data
        self.out, self.size = ctypes.c_void_p(), ctypes.c_int64()
        self.out_ref, self.size_ref = ctypes.byref(self.out), ctypes.byref(self.size)


def _entry() -> Any:
    lib = native_route._LIB
    fn = getattr(lib, "rs_route_process_values", None) if lib is not None else None
    if fn is not None:
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        fn.restype, fn.argtypes = ctypes.c_int, [p, ctypes.c_char_p, i64, ctypes.c_char_p, i64, ctypes.c_char_p,
                                                 p, p, p]
    return fn


_process_values = _entry()
_NO_PACKING: Any = object()


class NativePredict:
    """One Processor's hand-off of `predict` calls to its native route."""

    def __init__(self, manager: ServableManager[Servable]) -> None:
        self._manager = manager
        self._slot = manager.route_slot
        # (signature, filter, ((name, dtype, shape), ...)) -> _Packing, or None: Python only.
        self._packings: dict[Any, _Packing | None] = {}
        # layout -> the plan its responses are read by (None: _read_any).
        self._outputs: dict[bytes, _Outputs | None] = {}
        # Layouts whose route a version was already asked to build (never twice per version).
        self._tried: weakref.WeakKeyDictionary[Any, set[bytes]] = weakref.WeakKeyDictionary()
        self._local = threading.local()

    def predict(self, inputs: Mapping[str, Any], output_filter: Sequence[str] | None, signature_name: str | None,
                trace: RequestTrace | None) -> dict[str, np.ndarray] | None:
        """`Servable.predict`'s answer served natively, or None: take the Python route."""
        if _process_values is None or self._slot._native is None or self._slot.address is None:
            return None
        if trace is not None and trace.want_ort_profile:
            return None
        try:
            names = tuple(inputs)
            arrays = [v if type(v) is np.ndarray else np.asarray(v) for v in inputs.values()]
            signature = signature_name or ""
            wanted = tuple(output_filter) if output_filter else ()
            key = (signature, wanted, names, *[(a.dtype, a.shape) for a in arrays])
            packing = self._packings.get(key, _NO_PACKING)
        except (TypeError, ValueError):
            return None   # the Python route says what is wrong with it
        if packing is _NO_PACKING:
            packing = self._new_packing(key, signature, wanted, names, arrays)
        if packing is None:
            return None
        packed = packing.values(arrays)
        if packed is None:
            return None
        values, data = packed
        try:
            call = self._local.call
        except AttributeError:
            call = self._local.call = _Call()
        layout = packing.layout
        if _process_values(self._slot.address, layout, len(layout), values, len(values) >> 3, data,
                           call.out_ref, call.size_ref, call.info_address) != 200:
            if call.info[_INFO_REASON] == _ROUTE_MISS:
                self._build_route(layout, signature, wanted, names, arrays)
            return None
        try:
            response = ctypes.string_at(call.out.value, call.size.value)  # type: ignore[arg-type]
        finally:
            native_route._free_holding_gil(call.out.value)
        reader = self._outputs.get(layout, _NO_PACKING)
        if reader is _NO_PACKING:
            if len(self._outputs) >= _CACHE_LIMIT:
                self._outputs.clear()
            reader = self._outputs[layout] = _Outputs.plan(response)
        outputs = reader.read(response) if reader is not None else None
        if outputs is None:
            if reader is not None:
                self._outputs.pop(layout, None)   # other shapes than before (a new version): plan again
            outputs = _read_any(response)
        if trace is not None:
            _fill_trace(trace, call.info)
        return outputs

    def _new_packing(self, key: Any, signature: str, wanted: tuple[str, ...], names: tuple[str, ...],
                     arrays: list[np.ndarray]) -> _Packing | None:
        try:
            packing = _packing(signature, wanted, names, arrays)
            if packing is not None and not _checked(packing, signature, wanted, names, arrays):
                packing = None
        except (AttributeError, TypeError, ValueError):   # a name or filter that is not text, unencodable text
            packing = None
        if len(self._packings) >= _CACHE_LIMIT:
            self._packings.clear()
        self._packings[key] = packing
        return packing

    def _build_route(self, layout: bytes, signature: str, wanted: tuple[str, ...], names: tuple[str, ...],
                     arrays: list[np.ndarray]) -> None:
        """Asks the current version to build and register the layout's route, as the first
        `process` of it would (once per version: invalid requests fail in Python each time)."""
        with self._manager.acquire() as servable:
            native = servable.native
            if native is None:
                return
            tried = self._tried.setdefault(native, set())
            if layout in tried:
                return
            if len(tried) >= _CACHE_LIMIT:
                tried.clear()
            tried.add(layout)
            parsed = codec.parse_request(_request_bytes(signature, wanted, names, arrays))
            if parsed is None or parsed.layout != layout:
                return
            try:
                servable.route(parsed)
            except RecserveError:
                pass   # the Python route raises it for this request again, with its message
            except Exception:   # a bug: logged; the Python route answers the request
                log.exception("native predict: building the route of a layout failed")

