"""The Python side of the native request route (native/route.h, DESIGN §10).

Python stays the control plane: a route is still built and validated by
`recserve.processor.request_route.RequestRoute` on the first request of a layout; this
module then *registers* its compiled form with the version's native servable, and every
later request of that layout goes from bytes to bytes in C with the GIL released
(`RouteSlot.process`, or the C ABI's `process()` calling `rs_route_process` directly).
Python threads call it through `_route_call` (native/route_call.c), a CPython module that
holds the GIL only to read its arguments and build the response bytes; ctypes (this module's
other calls) is the control plane.

- `RouteSlot`: one per Processor (its `ServableManager` owns it). Publishes the current
  version's `NativeServable` by atomic pointer swap; counts the requests that fell back to
  Python, by reason.
- `NativeServable`: one per version with in-process tables. Carries the compiled routes and
  the dense runner; `close()` waits for its native leases to end, then frees it.
- The dense runner: `dense_runner(sessions)`: the session group's ONNX Runtime C API runner
  (`OrtRunner`), so the whole request runs without the GIL; where the group has none, or
  merges requests in Python (dynamic batching), `PythonRunner`, the *fallback runner*: a C
  function pointer (ctypes callback) that takes the GIL for the dense run only. Request
  merging's runs (`RouteSlot.process_many`, rs_route_process_many) skip a dynamic batcher:
  `merged_runner(sessions)`, the C API runner where the group has one.

Thread-safe: routes register concurrently with requests; publish/close run on the manager's
threads.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import math
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.embedding import IntegerKeys, StringKeys
from recserve.errors import RecserveError
from recserve.native_library import open_library
from recserve.processor.trace import Span

if TYPE_CHECKING:
    from recserve.processor.request_route import RequestRoute, _FoldedFeed
    from recserve.processor.servable import Servable
    from recserve.processor.session_group import SessionGroup
    from recserve.processor.trace import RequestTrace
    from recserve.runtime.input_concat import InputConcat

__all__ = ["FALLBACK_REASONS", "NativeServable", "OrtRunner", "PythonRunner", "RouteSlot", "dense_runner", "merged_runner",
           "native_servable", "watch_versions"]

log = logging.getLogger("recserve.processor")

# RS_FALLBACK_* in native/route.h, in order.
FALLBACK_REASONS = ("no_servable", "parse", "route_miss", "lookup", "run", "output", "memory", "empty", "trace",
                    "not_native")
_NO_SERVABLE, _TRACE = 0, 8
_SERVED, _WALL_NS, _COUNTERS = 10, 11, 12
_ROUTE_FORMAT = 2
# How a string input's ids, or an integer input's through an integer vocabulary, become keys.
_KEY_XXH64, _KEY_BUCKETS, _KEY_VOCABULARY, _KEY_BUCKETS_EMPTY, _KEY_INT_VOCABULARY = 0, 1, 2, 3, 4  # route.c's KEY_*
# RS_ELEM_* (ONNX TensorProto element types) of the dtypes the route feeds.
_ELEM = {np.dtype(np.float32): 1, np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.bool_): 9,
         np.dtype(np.float64): 11}
_DTYPE = {v: k for k, v in _ELEM.items()}
# RS_CODEC_OUT_* -> the wire kind of the values buffer: int64 slots (0), float32 (1) or
# float64 (2) bytes; half, complex and strings are not fed natively.
_SRC = {**{out: 0 for out in range(7)}, 7: 1, 8: 2}
_DRAIN_WARN_MS = 10_000


class _TensorIn(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("elem_type", ctypes.c_int32), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("rank", ctypes.c_size_t), ("data", ctypes.c_void_p)]


class _TensorOut(ctypes.Structure):
    _fields_ = [("elem_type", ctypes.c_int32), ("shape", ctypes.c_int64 * 8), ("rank", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("bytes", ctypes.c_size_t)]


# rs_dense_run_fn (native/dense_run.h)
DENSE_RUN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_TensorIn), ctypes.c_size_t,
                             ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.POINTER(_TensorOut),
                             ctypes.POINTER(ctypes.c_void_p))


def _load() -> tuple[ctypes.CDLL | None, ModuleType | None]:
    """The route library (ctypes: the control plane) and `_route_call`, Python threads' call
    into it (a CPython module: it holds the GIL far less per request than a ctypes call);
    (None, None) when either is missing or the route is turned off."""
    if os.environ.get("RECSERVE_NATIVE_ROUTE") == "0":   # off: every request takes the Python route
        return None, None
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    try:
        lib = open_library(Path(__file__).with_name("librecserve_route.so"), "native route", {
            "rs_slot_create": (p, []),
            "rs_slot_free": (None, [p]),
            "rs_slot_publish": (None, [p, p, ctypes.c_int32]),
            "rs_slot_count": (None, [p, ctypes.c_int32]),
            "rs_slot_counters": (i64, [p, p, i64]),
            "rs_servable_create": (p, [i64, p, p, p, p, p]),
            "rs_servable_set_merged_run": (None, [p, p, p]),
            "rs_servable_set_delta_step": (None, [p, i64]),
            "rs_servable_add_vocabulary": (i64, [p, ctypes.c_char_p, p, p, i64, i64, i64, i64, ctypes.c_int32]),
            "rs_servable_add_int_vocabulary": (i64, [p, p, p, i64, i64, ctypes.c_int32]),
            "rs_servable_add_route": (ctypes.c_int, [p, ctypes.c_char_p, i64, p, i64, ctypes.c_char_p, i64]),
            "rs_servable_refuse_layout": (ctypes.c_int, [p, ctypes.c_char_p, i64]),
            "rs_servable_routes": (i64, [p]),
            "rs_servable_drain": (ctypes.c_int, [p, i64]),
            "rs_servable_leases": (i64, [p]),
            "rs_servable_free": (None, [p]),
        }, twin=False)
        try:
            from recserve.processor import _route_call
        except ImportError as exc:
            raise ImportError(f"recserve's native route call (the _route_call module) is missing or broken ({exc}); "
                              "build it with `python setup.py build_ext --inplace`") from exc
    except ImportError as exc:
        log.warning("the native request route is unavailable (%s); requests take the Python route", exc)
        return None, None
    _route_call.bind(ctypes.cast(lib.rs_route_process, ctypes.c_void_p).value,
                     ctypes.cast(lib.rs_route_process_tfs, ctypes.c_void_p).value,
                     ctypes.cast(lib.rs_route_process_values, ctypes.c_void_p).value,
                     ctypes.cast(lib.rs_route_process_many, ctypes.c_void_p).value)
    return lib, _route_call


_LIB, _CALL = _load()
_route = _CALL.process if _CALL is not None else None
_libc = ctypes.CDLL(None)
_libc.malloc.restype, _libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
_libc.free.restype, _libc.free.argtypes = None, [ctypes.c_void_p]


def route_process_address(tfs: bool = False) -> int:
    """The address of rs_route_process (rs_route_process_tfs), for native callers: the C
    ABI shim, the gRPC front end (0 without the library)."""
    if _LIB is None:
        return 0
    return ctypes.cast(_LIB.rs_route_process_tfs if tfs else _LIB.rs_route_process, ctypes.c_void_p).value or 0


class RouteSlot:
    """The native servable that answers new requests of one Processor, and its counters."""

    def __init__(self) -> None:
        self.address = _LIB.rs_slot_create() if _LIB is not None else None
        if _LIB is not None and not self.address:
            raise MemoryError("rs_slot_create failed")
        self._native: NativeServable | None = None
        # The slot's address while a native servable is published, else 0: process()'s one test.
        self._serving = 0
        self._unpublished = 0   # requests that found nothing native published (counted without a C call)
        if self.address:
            # Freed with this object: the C ABI's handle holds the Processor, so nothing can
            # call rs_route_process on the slot any more by then. Not at the interpreter's
            # exit, where finalizers run while daemon threads (a version's close publishing,
            # the gRPC front end's) may still use it: ASan found the slot published after
            # that free; the process's end frees it.
            weakref.finalize(self, _LIB.rs_slot_free, self.address).atexit = False   # type: ignore[union-attr]

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def publish(self, servable: Any) -> None:
        """Serve `servable`'s native routes from now on (none if it has no native servable).
        Callers serialise publishes (the manager's lock)."""
        native = getattr(servable, "native", None)
        if self.address is not None:
            _LIB.rs_slot_publish(self.address, native.address if native else None, _NO_SERVABLE)  # type: ignore[union-attr]
        self._native = native
        self._serving = self.address if native is not None and self.address else 0

    def count(self, reason: int) -> None:
        if self.address is not None:
            _LIB.rs_slot_count(self.address, reason)  # type: ignore[union-attr]

    def process(self, data: bytes | bytearray | memoryview, trace: RequestTrace | None) -> bytes | None:
        """The response served natively, or None: take the Python path (counted natively).
        `data`: any contiguous buffer, read in place (not copied) with the GIL released."""
        # Every Python thread's request passes here holding the GIL: the fewer bytecodes
        # before the GIL is released, the less often another thread waits for it.
        slot = self._serving
        if slot and trace is None:
            return _route(slot, data)  # type: ignore[misc]
        return self._serve(False, data, trace)

    def process_tfs(self, data: bytes | bytearray | memoryview, trace: RequestTrace | None) -> bytes | None:
        """`process` for a tensorflow.serving.PredictRequest: its PredictResponse's outputs
        (no model_spec: the caller checks the version `trace` names and appends it), or None."""
        return self._serve(True, data, trace)

    def _serve(self, tfs: bool, data: bytes | bytearray | memoryview, trace: RequestTrace | None) -> bytes | None:
        """process() when nothing native is published or the request is traced; process_tfs()."""
        if not self._serving:
            self._unpublished += 1   # no C call: it would release the GIL for nothing
            return None
        assert _CALL is not None
        if trace is not None and trace.want_ort_profile:
            self.count(_TRACE)
            return None
        served = _CALL.process_traced(self._serving, data, tfs)
        if served is None:
            return None
        response, info = served
        if trace is not None:
            _fill_trace(trace, info)
        return response

    def process_many(self, payloads: Sequence[bytes], traces: Sequence[RequestTrace],
                     max_rows: int) -> list[bytes | None]:
        """Request merging on the native route (rs_route_process_many): each payload's
        response, byte for byte what `process` answers it alone, the requests whose layouts
        agree merged into dense runs of up to `max_rows` rows; None for each one the route
        did not serve (counted natively): take the Python path
        (recserve.processor.merged_runs). Their traces are filled as `process` fills them,
        with `merged_with`."""
        if not self._serving:
            self._unpublished += len(payloads)
            return [None] * len(payloads)
        assert _CALL is not None
        asked = [i for i, trace in enumerate(traces) if not trace.want_ort_profile]
        if len(asked) < len(payloads):   # an ONNX Runtime profile: the Python path's, alone
            for _ in range(len(payloads) - len(asked)):
                self.count(_TRACE)
        if not asked:
            return [None] * len(payloads)
        if len(asked) == len(payloads):
            served = _CALL.process_many(self._serving, payloads if type(payloads) is list else list(payloads), max_rows)
        else:
            served = [None] * len(payloads)
            for i, answer in zip(asked, _CALL.process_many(self._serving, [payloads[i] for i in asked], max_rows)):
                served[i] = answer
        responses: list[bytes | None] = [None] * len(payloads)
        first, last, version = 1 << 63, 0, None
        for i, answer in enumerate(served):
            if answer is not None:
                responses[i], info = answer
                if version is None:   # one lease: every served request's version is the first's
                    version = _served_version(info[0])
                _fill_merged_trace(traces[i], info, version)
                first, last = min(first, info[3]), max(last, info[10])
        # The C call is shared: each served trace holds its whole GIL-free time (recserve.server.merging).
        for trace, response in zip(traces, responses):
            if response is not None:
                trace.released_ns = last - first
        return responses

    def counters(self) -> dict[str, Any]:
        """{"served": n, "wall_seconds": s, "fallbacks": {reason: n}}."""
        raw = np.zeros(_COUNTERS, np.int64)
        if self.address is not None:
            _LIB.rs_slot_counters(self.address, raw.ctypes.data, _COUNTERS)  # type: ignore[union-attr]
        return {
            "served": int(raw[_SERVED]),
            "wall_seconds": raw[_WALL_NS] / 1e9,
            "fallbacks": {reason: int(raw[i]) + (self._unpublished if i == _NO_SERVABLE else 0)
                          for i, reason in enumerate(FALLBACK_REASONS)},
        }


# id -> (version, the servable) of every native servable made: a natively served request
# reports its servable's id, and its trace names that version (not "the current one").
_served_by: dict[int, tuple[str, weakref.ReferenceType[Any]]] = {}
_ids = itertools.count(1)
_version_listeners: list[Callable[[int, str, int], None]] = []


def watch_versions(listener: Callable[[int, str, int], None]) -> None:
    """`listener(servable id, version, global step)` for each native servable made in this
    process, those made already first: a native caller of rs_route_process names the version
    that served a request by the id it reports (RS_INFO_SERVABLE)."""
    for servable_id, (version, ref) in list(_served_by.items()):
        servable = ref()
        if servable is not None:
            listener(servable_id, version, servable.global_step)
    _version_listeners.append(listener)


def _fill_trace(trace: RequestTrace, info: tuple[int, ...]) -> None:
    # On every natively served request with a trace (every server request): the spans made
    # as plain tuples of the Span type (its generated __new__ is a Python call each).
    servable_id, batch, t0, t1, t2, t3, t4 = info   # _route_call.process_traced's
    trace_served_by(trace, servable_id, batch)
    trace.released_ns = t4 - t0
    new = tuple.__new__
    trace.spans.extend((new(Span, ("decode", t0, t1)), new(Span, ("lookup", t1, t2)),
                        new(Span, ("run", t2, t3)), new(Span, ("encode", t3, t4))))


def _fill_merged_trace(trace: RequestTrace, info: tuple[int, ...], version: tuple[str, int]) -> None:
    """`_fill_trace` for a request rs_route_process_many served (`version`: its servable's
    `_served_version`): its spans need not be back to back (a merged request's run waits for
    its neighbours' lookups)."""
    _, batch, merged, t0, t1, lookup, t2, run, t3, encode, t4 = info   # _route_call.process_many's
    trace.model_version, trace.delta_step = version
    trace.batch_size = batch
    trace.merged_with = merged
    new = tuple.__new__
    trace.spans.extend((new(Span, ("decode", t0, t1)), new(Span, ("lookup", lookup, t2)),
                        new(Span, ("run", run, t3)), new(Span, ("encode", encode, t4))))


def trace_served_by(trace: RequestTrace, servable_id: int, batch: int) -> None:
    """What a trace records of the version that served a request natively (by the servable
    id route.h's RS_INFO_SERVABLE reports) and of its batch."""
    trace.model_version, trace.delta_step = _served_version(servable_id)
    trace.batch_size = batch


def _served_version(servable_id: int) -> tuple[str, int]:
    """(version, delta step) of the native servable `servable_id` now."""
    version, ref = _served_by.get(servable_id, ("", _no_servable))
    servable = ref()
    return version, servable.delta_step if servable is not None else 0


def _no_servable() -> None:
    return None


class PythonRunner:
    """TEST/FALLBACK dense runner: an rs_dense_run_fn that takes the GIL (a ctypes callback
    does) and runs the session group from Python. Makes the native route complete before the
    ONNX Runtime C API runner exists; its dense run does not scale across threads."""

    def __init__(self, sessions: SessionGroup, *, merged: bool = False) -> None:
        self._sessions = sessions
        self._merged = merged   # runs that are merges already: SessionGroup.run(merged=True)
        self.function = DENSE_RUN(self._run)
        self.address = ctypes.cast(self.function, ctypes.c_void_p).value
        self.runner = None

    def _run(self, runner: int, inputs: Any, n_inputs: int, names: Any, n_outputs: int, outputs: Any,
             err: Any) -> int:
        try:
            feeds = {}
            for i in range(n_inputs):
                t = inputs[i]
                dtype = _DTYPE[t.elem_type]
                shape = tuple(t.shape[j] for j in range(t.rank))
                count = math.prod(shape)
                raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(t.data) if count else b""
                feeds[t.name.decode()] = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
            results = self._sessions.run([names[i].decode() for i in range(n_outputs)], feeds, merged=self._merged)
            for i, value in enumerate(results):
                out = outputs[i]
                value = np.ascontiguousarray(value)
                out.elem_type = _ELEM.get(value.dtype, 0)
                out.rank = value.ndim
                for j, d in enumerate(value.shape[:8]):
                    out.shape[j] = d
                out.bytes = value.nbytes
                out.data = _libc.malloc(max(value.nbytes, 1))
                ctypes.memmove(out.data, value.ctypes.data, value.nbytes)
            return 0
        except Exception as exc:  # noqa: BLE001 - a C caller gets a status and a message
            for i in range(n_outputs):
                _libc.free(outputs[i].data)
                outputs[i].data = None
            message = (exc.message if isinstance(exc, RecserveError) else f"{type(exc).__name__}: {exc}").encode()
            text = _libc.malloc(len(message) + 1)
            ctypes.memmove(text, message + b"\0", len(message) + 1)
            err[0] = text
            return exc.status if isinstance(exc, RecserveError) else 500


class OrtRunner:
    """The ONNX Runtime C API runner of a session group (recserve.runtime.native_runner):
    `rs_ort_dense_run` and its runner pointer. Runs without the GIL."""

    def __init__(self, sessions: SessionGroup) -> None:
        native = sessions.native_runner
        assert native is not None
        self._native = native   # kept alive: the C side holds its handle
        self.address = native.dense_run_address
        self.runner = native.handle


def dense_runner(sessions: SessionGroup) -> OrtRunner | PythonRunner:
    """The runner the native route calls (`address`, the rs_dense_run_fn, and `runner`, its
    first argument): the session group's C API runner; the Python one where the group runs on
    Python sessions (RECSERVE_NATIVE_DENSE=0, string graph inputs) or merges requests
    (dynamic batching: the batcher is Python)."""
    if getattr(sessions, "native_runner", None) is not None and sessions._batcher is None:
        return OrtRunner(sessions)
    return PythonRunner(sessions)


def merged_runner(sessions: SessionGroup) -> OrtRunner | PythonRunner | None:
    """The runner of request merging's runs (rs_servable_set_merged_run), or None when it is
    `dense_runner`'s: they are merges of requests already, so where the group has a dynamic
    batcher they skip it, as merged_runs' SessionGroup.run(merged=True) does -- on the C API
    runner when the group has one."""
    if sessions._batcher is None:
        return None
    if getattr(sessions, "native_runner", None) is not None:
        return OrtRunner(sessions)
    return PythonRunner(sessions, merged=True)


class NativeServable:
    """One version's native servable: its compiled routes and dense runner."""

    def __init__(self, servable: Servable, runner: Any, merged: Any = None) -> None:
        from recserve.embedding import _native as engine

        self.id = next(_ids)
        self._runner = runner   # kept alive: the C side calls it
        self._merged_runner = merged   # request merging's runner (merged_runner), None: `runner`
        # The C API runner feeds graph inputs as they are: a Concat the session group folds
        # in Python (SessionGroup._feed) is folded by the route instead -- for both runners
        # when merging's is that one (the Python runner's _feed takes a folded feed as it is).
        folds = isinstance(runner, OrtRunner) or isinstance(merged, OrtRunner)
        self._concat = servable.sessions.concat if folds else None
        self._lock = threading.Lock()
        self._closed = False
        lookup_at = ctypes.cast(engine._LIB.rs_lookup_at, ctypes.c_void_p).value
        xxh64 = ctypes.cast(engine._LIB.rs_xxh64_spans, ctypes.c_void_p).value
        buckets = ctypes.cast(engine._LIB.rs_bucket_spans, ctypes.c_void_p).value
        self.address = _LIB.rs_servable_create(self.id, runner.address, runner.runner, lookup_at, xxh64,  # type: ignore[union-attr]
                                               buckets)
        if not self.address:
            raise MemoryError("rs_servable_create failed")
        if merged is not None:
            _LIB.rs_servable_set_merged_run(self.address, merged.address, merged.runner)  # type: ignore[union-attr]
        # id(StringKeys or IntegerKeys) -> (it, its native vocabulary's handle): built here,
        # with the version (never on a request thread), freed with the servable (rs_servable_free).
        self._vocabularies: dict[int, tuple[StringKeys | IntegerKeys, int]] = {}
        for _, bound, _ in servable.plans.values():
            for _, _, keys in bound:
                if isinstance(keys, IntegerKeys) or (isinstance(keys, StringKeys) and keys.vocabulary):
                    self._vocabulary(keys)
        _LIB.rs_servable_set_delta_step(self.address, servable.delta_step)  # type: ignore[union-attr]
        _served_by[self.id] = (servable.version, weakref.ref(servable))
        for listener in _version_listeners:
            listener(self.id, servable.version, servable.global_step)

    def set_delta_step(self, delta_step: int) -> None:
        """The delta its tables are at now: the requests it serves from now on report it."""
        if self.address is not None:
            _LIB.rs_servable_set_delta_step(self.address, delta_step)  # type: ignore[union-attr]

    @property
    def routes(self) -> int:
        return int(_LIB.rs_servable_routes(self.address))  # type: ignore[union-attr]

    def add(self, layout: bytes, route: RequestRoute) -> bool:
        """Registers `route` for requests of `layout`; False when it cannot run natively (its
        requests are then counted as `not_native`)."""
        with self._lock:
            if self._closed:
                return False
            described = describe(route, self._concat, self._vocabulary)
            if described is None:
                _LIB.rs_servable_refuse_layout(self.address, layout, len(layout))  # type: ignore[union-attr]
                return False
            ints, names = described
            got = _LIB.rs_servable_add_route(self.address, layout, len(layout), ints.ctypes.data, len(ints),  # type: ignore[union-attr]
                                             names, len(names))
        if got < 0:
            log.error("the native route rejected a route description (a recserve bug); that layout stays in Python")
        return got == 0

    def _vocabulary(self, keys: StringKeys | IntegerKeys) -> int:
        """The handle of `keys`' vocabulary in this servable (built once); 0 when out of memory.
        Called while the servable is made, or under self._lock."""
        known = self._vocabularies.get(id(keys))
        if known is not None:
            return known[1]
        if isinstance(keys, IntegerKeys):
            # As listed (an id listed twice too: the C build keeps its last key, as the spec does)
            listed = [(word, keys.vocabulary_start + i) for i, word in enumerate(keys.vocabulary) if word is not None]
            ids = np.array([word for word, _ in listed], np.int64)
            indices = np.array([index for _, index in listed], np.int64)
            size = len(listed)
            handle = int(_LIB.rs_servable_add_int_vocabulary(  # type: ignore[union-attr]
                self.address, ids.ctypes.data, indices.ctypes.data, len(ids), keys.default_id, int(keys.padding)))
        else:
            words = list(keys.indices.items())
            size = len(words)
            blob = b"".join(word for word, _ in words)
            lengths = np.array([len(word) for word, _ in words], np.int64)
            indices = np.array([index for _, index in words], np.int64)
            handle = int(_LIB.rs_servable_add_vocabulary(  # type: ignore[union-attr]
                self.address, blob, lengths.ctypes.data, indices.ctypes.data, len(words), keys.default_id,
                keys.oov_buckets, keys.oov_start, int(keys.empty_is_padding)))
        if handle:
            self._vocabularies[id(keys)] = (keys, handle)
        else:
            log.error("version %s: no memory for a native vocabulary of %d entries; its layouts stay in Python",
                      _served_by[self.id][0], size)
        return handle

    def close(self) -> None:
        """Waits for the requests leasing this servable natively to end, then frees it. The
        manager has unpublished it already (a swap), so no new lease can start."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        while _LIB.rs_servable_drain(self.address, _DRAIN_WARN_MS):  # type: ignore[union-attr]
            log.warning("version %s: %d native requests still hold it after %d s; waiting",
                        _served_by[self.id][0], _LIB.rs_servable_leases(self.address) - 1,  # type: ignore[union-attr]
                        _DRAIN_WARN_MS // 1000)
        _LIB.rs_servable_free(self.address)  # type: ignore[union-attr]
        self.address = None


def native_servable(servable: Servable) -> NativeServable | None:
    """The version's native servable, or None when its requests need Python: tables in Redis
    (their lookups are Python), a placed model whose ids go through the ids graph, the pure
    Python engine (RECSERVE_PURE_PYTHON), or no native route library."""
    from recserve.embedding import LookupPlan
    from recserve.embedding import _native as engine

    if _LIB is None or servable.redis is not None or servable.placed is not None:
        return None
    if LookupPlan is not engine.LookupPlan:
        return None
    return NativeServable(servable, dense_runner(servable.sessions), merged_runner(servable.sessions))


def _plan_outputs(route: RequestRoute) -> list[tuple[str, int, tuple[int, ...]]]:
    """(graph input, offset in the float32 arena, shape) of each lookup plan output."""
    outputs, offset = [], 0
    for graph_input, shape in zip(route._bound, route._layout.shapes):
        outputs.append((graph_input, offset, tuple(shape)))
        offset += math.prod(shape)
    return outputs


def _fold(route: RequestRoute, concat: InputConcat) -> _FoldedFeed | None:
    """The Concat input the session group would fold in Python (`InputConcat.fold`) for a
    route that does not fold it itself: each part a [batch, w] float32 dense input (a column)
    or plan output (a block of one); None when a part is neither."""
    from recserve.processor.request_route import _FoldedFeed

    batch, column = route.batch_size, 0
    outputs = {graph_input: (offset, shape) for graph_input, offset, shape in _plan_outputs(route)}
    columns, inputs, blocks = [], [], []
    for part in concat.parts:
        if part in outputs:
            offset, shape = outputs[part]
            if len(shape) != 2 or shape[0] != batch:
                return None
            blocks.append((column, offset, 1, shape[1]))
            column += shape[1]
        elif part in route.sources:
            wire, dtype = route.sources[part]
            if np.dtype(dtype) != np.float32 or len(wire.dims) != 2 or wire.dims[0] != batch:
                return None
            columns.append((column, column + wire.dims[1], None))
            inputs.append(part)
            column += wire.dims[1]
        else:
            return None
    return _FoldedFeed(concat.output, column, tuple(columns), tuple(blocks), tuple(inputs))  # type: ignore[arg-type]


def describe(route: RequestRoute, concat: InputConcat | None = None,
             vocabulary: Callable[[StringKeys | IntegerKeys], int] | None = None) -> tuple[np.ndarray, bytes] | None:
    """The int64 description rs_servable_add_route compiles (see native/route.c, compile())
    and its NUL-terminated names; None when a part of the route has no native form (the
    layout's requests are then counted as `not_native` and served in Python): a dense input
    whose wire type or cast has no native reader (half floats, complex, strings fed to the
    graph as they are), a Concat the session group folds that the route cannot, a string or
    integer vocabulary that could not be built (`vocabulary` returned 0, or none was given),
    a bucket count of 2**63 or more (model.json allows it; TensorFlow's are int64).
    `concat`: the session group's folded Concat of graph inputs, if it has one;
    `vocabulary`: the servable's native handle of a StringKeys' or IntegerKeys' vocabulary."""
    names: dict[str, int] = {}
    blob = bytearray()

    def name(text: str) -> int:
        if text not in names:
            names[text] = len(blob)
            blob.extend(text.encode() + b"\0")
        return names[text]

    plan_layout, folded = route._layout, route._folded
    fold = _fold(route, concat) if folded is None and concat is not None else None
    if folded is None and concat is not None and fold is None:
        return None   # the session group would concatenate in Python; the route cannot
    if fold is not None:
        folded = fold
    ints: list[int] = [_ROUTE_FORMAT, route.batch_size, len(route._strings)]
    for first, stop, keys in route._strings:
        if isinstance(keys, IntegerKeys):   # int64 ids, one slot each
            handle = vocabulary(keys) if vocabulary is not None else 0
            if not handle:
                return None
            ints += [first, stop, _KEY_INT_VOCABULARY, handle]
        elif keys.vocabulary:
            if keys.oov_buckets >= 1 << 63:
                return None   # no int64 holds it
            handle = vocabulary(keys) if vocabulary is not None else 0
            if not handle:
                return None
            ints += [first, stop, _KEY_VOCABULARY, handle]
        elif keys.buckets:
            if keys.buckets >= 1 << 63:
                return None   # no int64 in the description holds it (TensorFlow's own are int64)
            ints += [first, stop, _KEY_BUCKETS if keys.empty_is_padding else _KEY_BUCKETS_EMPTY, keys.buckets]
        else:
            ints += [first, stop, _KEY_XXH64, 0]
    tasks = plan_layout.tasks
    ints.append(len(tasks))
    ints += tasks.reshape(-1).tolist()
    ints.append(plan_layout.out_size)
    parts = set(concat.parts) if fold is not None and concat is not None else set()
    if route._folded is None:
        bound = [(graph_input, offset, shape) for graph_input, offset, shape in _plan_outputs(route)
                 if graph_input not in parts]
        ints.append(len(bound))
        for graph_input, offset, shape in bound:
            ints += [name(graph_input), offset, len(shape), *shape]
    else:
        ints.append(0)
    dense = [(graph_input, *route.sources[graph_input]) for graph_input, _, _ in route._dense
             if graph_input not in parts]
    ints.append(len(dense))
    for graph_input, wire, dtype in dense:
        src, elem = _SRC.get(wire.out), _ELEM.get(np.dtype(dtype))
        if src is None or elem is None or math.prod(wire.dims) != wire.count:
            return None
        ints += [name(graph_input), src, wire.slot, wire.count, elem, len(wire.dims), *wire.dims]
    if folded is None:
        ints.append(0)
    else:
        ints += [1, name(folded.name), folded.width, len(folded.columns)]
        for (start, stop, _), graph_input in zip(folded.columns, folded.column_inputs):
            wire = route.sources[graph_input][0]
            src = _SRC.get(wire.out)
            if src is None or wire.count != route.batch_size * (stop - start):
                return None
            ints += [start, stop, src, wire.slot, wire.count]
        ints.append(len(folded.blocks))
        for block in folded.blocks:
            ints += list(block)
    ints.append(len(route.output_keys))
    for key, graph_name in zip(route.output_keys, route.output_names):
        ints += [name(key), name(graph_name)]
    return np.array(ints, dtype=np.int64), bytes(blob)


def route_counts(slots: Sequence[RouteSlot]) -> dict[str, int]:
    """Fallbacks by reason summed over `slots` (for metrics)."""
    total: dict[str, int] = {}
    for slot in slots:
        for reason, n in slot.counters()["fallbacks"].items():
            total[reason] = total.get(reason, 0) + n
    return total
