"""The native engine through ctypes: native/embedding.h's functions, declared one by one.

ctypes.CDLL releases the GIL for the duration of every call, so lookups on many Python
threads run in parallel. Python never loops over ids here: every call passes whole arrays.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np

from recserve.embedding import _inputs, tiers
from recserve.errors import InternalError, StorageError
from recserve.model_spec import DefaultSpec
from recserve.native_library import open_library

_OK, _ENOMEM, _EDUPLICATE, _EINVAL, _EEMPTY, _EIO, _ENOSPC = range(7)
# rs_tier_stats's counters, in the order of RS_STAT_* (native/embedding.h).
_TIER_STATS = (
    "dram_capacity", "dram_rows", "dram_bytes", "index_bytes", "ssd_segments", "ssd_records",
    "ssd_live_records", "ssd_bytes", "hits", "misses", "promotions", "evictions", "compactions",
)
# RS_DEFAULT_* a table is created with; a "rows" one then gets its matrix (rs_table_set_default_rows).
_CREATE_KINDS = {"zeros": 0, "normal": 1, "rows": 0}
_TASK_FIELDS = 6  # rs_lookup_task: table, ids, out, rows, width, combiner (8 bytes each)

_p = ctypes.c_void_p
_i64 = ctypes.c_int64


class _TierConfig(ctypes.Structure):
    """rs_tier_config."""

    _fields_ = [
        ("path", ctypes.c_char_p),
        ("dram_bytes", _i64),
        ("ssd_bytes", _i64),
        ("segment_bytes", _i64),
        ("policy", _i64),
        ("io", _i64),
        ("async_compaction", _i64),
        ("eviction_threads", _i64),
    ]



def _load() -> ctypes.CDLL:
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "rs_table_create": (
            ctypes.c_int,
            [
                _i64,
                ctypes.c_int32,
                ctypes.c_double,
                ctypes.c_uint64,
                _p,
                _p,
                _i64,
                ctypes.POINTER(_p),
                ctypes.POINTER(_i64),
            ],
        ),
        "rs_tiered_create": (
            ctypes.c_int,
            [
                _i64,
                ctypes.c_int32,
                ctypes.c_double,
                ctypes.c_uint64,
                _p,
                _p,
                _i64,
                _p,
                _i64,
                ctypes.POINTER(_TierConfig),
                ctypes.POINTER(_p),
                ctypes.POINTER(_i64),
            ],
        ),
        "rs_tier_capacity": (_i64, [_i64, _i64]),
        "rs_tier_stats": (ctypes.c_int, [_p, _p]),
        "rs_tier_maintain": (ctypes.c_int, [_p]),
        "rs_tier_compact": (ctypes.c_int, [_p]),
        "rs_table_set_default_rows": (ctypes.c_int, [_p, _p, _i64]),
        "rs_table_free": (None, [_p]),
        "rs_table_size": (_i64, [_p]),
        "rs_table_storage_rows": (_i64, [_p]),
        "rs_lookup": (ctypes.c_int, [_p, _i64]),
        "rs_lookup_at": (ctypes.c_int, [_p, _i64, _p, _p]),
        "rs_table_lookup": (ctypes.c_int, [_p, _p, _i64, _i64, _i64, _p]),
        "rs_table_contains": (ctypes.c_int, [_p, _p, _i64, _p]),
        "rs_table_snapshot": (_i64, [_p, _p, _p, _i64]),
        "rs_table_keys": (_i64, [_p, _p, _i64]),
        "rs_table_sample": (ctypes.c_int, [_p, _p, _i64, _p]),
        "rs_table_upsert": (ctypes.c_int, [_p, _p, _p, _i64]),
        "rs_table_delete": (ctypes.c_int, [_p, _p, _i64]),
        "rs_default_vectors": (None, [ctypes.c_double, ctypes.c_uint64, _p, _i64, _i64, _p]),
        "rs_xxh64_batch": (None, [_p, _p, _p, _i64, _p]),
        "rs_xxh64_spans": (None, [ctypes.c_char_p, _p, _i64, _p]),
        "rs_bucket_batch": (None, [_p, _p, _p, _i64, ctypes.c_uint64, _p]),
        "rs_bucket_spans": (None, [ctypes.c_char_p, _p, _i64, ctypes.c_uint64, _p]),
    }
    return open_library(Path(__file__).with_name("librecserve_embedding.so"), "embedding", signatures)


_LIB = _load()
_char_at = ctypes.c_char.from_buffer


def _address(a: np.ndarray) -> int:
    """The data pointer of a C-contiguous array (ctypes.from_buffer is ~5x faster than
    ndarray.ctypes, which matters at 26 bindings per request)."""
    try:
        return ctypes.addressof(_char_at(cast(Any, a)))
    except (TypeError, ValueError, BufferError):  # read-only or empty
        return int(a.ctypes.data)


def _check(status: int, what: str) -> None:
    if status == _ENOMEM:
        raise MemoryError(f"embedding engine: out of memory during {what}")
    if status == _EIO:
        raise StorageError(f"embedding engine: {what} failed reading or writing the SSD tier")
    if status == _ENOSPC:
        raise StorageError(
            f"embedding engine: {what} needs more SSD tier space than its ssd_bytes budget "
            "(ev_storage_size[1]) allows even after compaction; nothing was applied"
        )
    if status != _OK:
        raise InternalError(f"embedding engine: {what} failed with status {status}")


class EmbeddingTable:
    """int64 key -> float32 row of `dim` in the native engine, with a default for unknown keys.

    `values` is adopted without a copy when it is a writeable, aligned, C-contiguous float32
    array; the table then owns it (later upserts may recycle its rows), so pass a copy if
    you keep using yours. Otherwise it is copied once, into `empty_rows` (rows on cache lines).

    With `storage` (a TierSpec, see tiers.py) the table is tiered: every row goes to record
    files under storage.ssd_path, written in chunks, and the rows with the highest `freqs`
    (the first ones without freqs) to a DRAM tier of storage.dram_bytes; the arrays are not
    kept, and `values` may be a read-only file mapping (a checkpoint's), read once in order.
    close() (or garbage collection) deletes the files.

    Thread-safety: lookup, contains, snapshot and sample_keys may run from any number of
    threads, lock-free, concurrently with upsert/delete; writers serialise on an internal
    lock. A reader sees each row entirely old or entirely new (native/embedding.h), whatever
    tier it comes from. close() must not race with any other call.
    """

    def __init__(
        self,
        name: str,
        dim: int,
        keys: np.ndarray,
        values: np.ndarray,
        *,
        default: DefaultSpec = _inputs.ZEROS,
        freqs: np.ndarray | None = None,
        versions: np.ndarray | None = None,
        storage: tiers.TierSpec | None = None,
    ) -> None:
        self._handle: int | None = None
        self._name = name
        where = f"table {name!r}"
        self._dim = _inputs.check_dim(where, dim)
        self._default = _inputs.check_default(where, default, self._dim)
        self._storage = storage
        keys, values = _inputs.check_rows(where, self._dim, keys, values, adopt=storage is None)
        _inputs.check_column(where, "freqs", freqs, len(keys))
        _inputs.check_column(where, "versions", versions, len(keys))
        handle, detail = _p(), _i64()
        default_args = (
            self._dim,
            _CREATE_KINDS[self._default.kind],
            self._default.stddev,
            _inputs.seed_u64(self._default),
            _address(keys),
            _address(values),
            len(keys),
        )
        self._values: np.ndarray | None = None
        if storage is None:
            status = _LIB.rs_table_create(*default_args, ctypes.byref(handle), ctypes.byref(detail))
            self._values = values  # storage block 0 lives in this array
        else:
            status = self._create_tiered(where, storage, default_args, freqs, handle, detail)
        if status == _EDUPLICATE:
            raise _inputs.DuplicateKeyError(name, detail.value)
        _check(status, f"loading {where}")
        self._handle = handle.value
        if self._default.matrix is not None:  # before any reader can see the table
            matrix = self._default.matrix
            _check(_LIB.rs_table_set_default_rows(self._handle, _address(matrix), len(matrix)),
                   f"the default rows of {where}")
        self._writer: threading.Lock | None = threading.Lock()

    @classmethod
    def attach(cls, name: str, dim: int, default: DefaultSpec, handle: int) -> EmbeddingTable:
        """The table another process (the leader of worker processes) built in the shared
        arena, read here through its handle: lookups only; the builder writes and frees it."""
        table = cls.__new__(cls)
        table._name, table._dim, table._default = name, dim, default
        table._storage, table._values, table._writer = None, None, None
        table._handle = handle
        return table

    @property
    def handle(self) -> int:
        """The native handle (shared with worker processes when built in the shared arena)."""
        if self._handle is None:
            raise InternalError(f"table {self._name!r} is closed")
        return self._handle

    def _create_tiered(
        self,
        where: str,
        storage: tiers.TierSpec,
        default_args: tuple[Any, ...],
        freqs: np.ndarray | None,
        handle: ctypes.c_void_p,
        detail: ctypes.c_int64,
    ) -> int:
        config = tiers.settings(where, storage)
        n = default_args[-1]
        capacity = int(_LIB.rs_tier_capacity(self._dim, config.dram_bytes))
        resident = tiers.resident_rows(capacity, freqs, n)
        record_bytes = n * (8 + 4 * self._dim)
        if record_bytes > config.ssd_bytes:
            raise StorageError(
                f"{where}: its {n} rows need {record_bytes} bytes in the SSD tier, more than "
                f"its ssd_bytes budget (ev_storage_size[1]) of {config.ssd_bytes}"
            )
        try:
            tiers.prepare_directory(config.ssd_path)
        except OSError as exc:
            raise StorageError(f"{where}: cannot use {config.ssd_path} for the SSD tier ({exc})") from exc
        self._tier_config = _TierConfig(
            os.fsencode(config.ssd_path),
            config.dram_bytes,
            config.ssd_bytes,
            config.segment_bytes,
            config.policy,
            config.io,
            int(config.async_compaction),
            config.eviction_threads,
        )
        status = int(
            _LIB.rs_tiered_create(
                *default_args,
                _address(resident),
                len(resident),
                ctypes.byref(self._tier_config),
                ctypes.byref(handle),
                ctypes.byref(detail),
            )
        )
        if status != _OK:
            tiers.remove_directory(config.ssd_path, storage.prune_up_to)
        if status == _EIO:
            raise StorageError(
                f"{where}: cannot write the SSD tier under {config.ssd_path} "
                f"({os.strerror(detail.value) if detail.value else 'I/O error'})"
            )
        return status

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Frees the table (and deletes a tiered table's files). Idempotent; no lookup, write
        or LookupPlan over this table may run during or after it."""
        handle, self._handle = getattr(self, "_handle", None), None
        if handle is None or getattr(self, "_writer", None) is None:
            return  # closed, or attached: the process that built it frees it
        _LIB.rs_table_free(handle)
        storage = getattr(self, "_storage", None)
        if storage is not None:
            tiers.remove_directory(Path(storage.ssd_path), storage.prune_up_to)

    @property
    def storage(self) -> tiers.TierSpec | None:
        return self._storage

    def tier_stats(self) -> dict[str, int] | None:
        """A tiered table's counters (docs/tiers.md); None for a DRAM table."""
        if self._storage is None:
            return None
        out = np.zeros(len(_TIER_STATS), dtype=np.int64)
        _check(_LIB.rs_tier_stats(self._handle, _address(out)), "tier_stats")
        return dict(zip(_TIER_STATS, out.tolist()))

    def _maintain(self) -> None:
        """Runs one admission/eviction round now (tests, benchmarks)."""
        _check(_LIB.rs_tier_maintain(self._handle), "tier maintenance")

    def _compact(self) -> None:
        """Compacts every record file holding garbage now (tests)."""
        _check(_LIB.rs_tier_compact(self._handle), "compaction")

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def default(self) -> DefaultSpec:
        return self._default

    def __len__(self) -> int:
        return int(_LIB.rs_table_size(self._handle))

    def _storage_rows(self) -> int:
        """Rows allocated in storage (live, retired and free); for tests of slot recycling."""
        return int(_LIB.rs_table_storage_rows(self._handle))

    def lookup(
        self, ids: np.ndarray, combiner: str = "none", out: np.ndarray | None = None
    ) -> np.ndarray:
        code = _inputs.combiner_code(combiner)
        ids = _inputs.check_ids(self._name, ids)
        shape = _inputs.output_shape(ids.shape, self._dim, code)
        out = (
            np.empty(shape, np.float32)
            if out is None
            else _inputs.check_out(self._name, out, shape)
        )
        width = ids.shape[1] if ids.ndim == 2 else 1
        status = _LIB.rs_table_lookup(
            self._handle, _address(ids), len(ids), width, code, _address(out)
        )
        _check(status, f"lookup in table {self._name!r}")
        return out

    def contains(self, keys: np.ndarray) -> np.ndarray:
        keys = _inputs.check_keys(f"table {self._name!r}", keys)
        found = np.empty(keys.shape, dtype=np.bool_)
        _check(
            _LIB.rs_table_contains(self._handle, _address(keys), keys.size, _address(found)),
            "contains",
        )
        return found

    def sample_keys(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n existing keys (with repetition), each the first live key at or after a uniformly
        random index bucket: cheap at any size, roughly uniform over keys."""
        positions = rng.integers(0, 2**63, size=n, dtype=np.int64)
        keys = np.empty(n, dtype=np.int64)
        status = _LIB.rs_table_sample(self._handle, _address(positions), n, _address(keys))
        if status == _EEMPTY:
            raise ValueError(f"table {self._name!r} has no rows to sample keys from")
        _check(status, "sample_keys")
        return keys

    def upsert(self, keys: np.ndarray, values: np.ndarray) -> None:
        keys, values = _inputs.check_rows(f"table {self._name!r}", self._dim, keys, values)
        with self._writable():
            status = _LIB.rs_table_upsert(self._handle, _address(keys), _address(values), len(keys))
        _check(status, f"upsert into table {self._name!r}")

    def delete(self, keys: np.ndarray) -> None:
        keys = _inputs.check_keys(f"table {self._name!r}", keys)
        with self._writable():
            status = _LIB.rs_table_delete(self._handle, _address(keys), keys.size)
        _check(status, f"delete from table {self._name!r}")

    def _writable(self) -> threading.Lock:
        if self._writer is None:
            raise InternalError(f"table {self._name!r} is read-only here: a worker process reads the "
                                "leader's table; the leader applies every update")
        return self._writer

    def keys(self) -> np.ndarray:
        """Every live key (in index order), without the rows."""
        capacity = len(self)
        while True:  # a concurrent writer may add keys between sizing and copying
            keys = np.empty(capacity, dtype=np.int64)
            seen = _LIB.rs_table_keys(self._handle, _address(keys), capacity)
            if seen <= capacity:
                return keys[:seen]
            capacity = seen + seen // 8

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        capacity = len(self)
        while True:  # a concurrent writer may add rows between sizing and copying
            keys = np.empty(capacity, dtype=np.int64)
            values = np.empty((capacity, self._dim), dtype=np.float32)
            seen = _LIB.rs_table_snapshot(self._handle, _address(keys), _address(values), capacity)
            if seen < 0:
                _check(_EIO, f"snapshot of table {self._name!r}")
            if seen <= capacity:
                return keys[:seen], values[:seen]
            capacity = seen + seen // 8


class _Layout:
    """Where one request shape's ids and outputs sit in the flat buffers of a plan run."""

    __slots__ = ("ids_end", "n", "out_size", "runs", "shapes", "tasks", "tasks_address")

    def __init__(self, tasks: np.ndarray, shapes: list[tuple[int, ...]], ids_end: int):
        self.tasks = tasks  # rs_lookup_task rows; ids/out columns hold byte offsets
        self.tasks_address = _address(tasks)
        self.n = len(tasks)
        self.shapes = shapes  # of each output
        self.ids_end = ids_end  # int64 slots the ids buffer must have
        # Consecutive outputs of one shape, as (start, stop, (count, *shape)) in the float32
        # arena: iterating one reshaped slice yields all their views at C speed.
        self.runs: list[tuple[int, int, tuple[int, ...]]] = []
        start = 0
        for shape, group in itertools.groupby(shapes):
            count = len(list(group))
            stop = start + count * math.prod(shape)
            self.runs.append((start, stop, (count, *shape)))
            start = stop
        self.out_size = start


class LookupPlan:
    """All embedding bindings of a model, looked up with ONE native call per request.

    Built once per model from (table, combiner) pairs, in the order the request's id arrays
    will come. run() concatenates the ids into one buffer, gives all outputs one float32
    arena (returned as views), and passes an array of rs_lookup_task structs to rs_lookup.
    The per-shape layout (offsets, output shapes) is computed once and cached, so the
    per-request Python work is a handful of numpy calls whatever the number of bindings.
    With `outs`, results are written into the caller's arrays instead (e.g. graph inputs).

    Callers whose ids already sit in one int64 buffer (the request decoder's) describe where
    once, with packed(), and skip the concatenate: run_packed(buffer, layout).

    Thread-safety: run() may be called from any number of threads concurrently, also with
    writers on the tables; the plan keeps its tables alive.
    """

    _MAX_LAYOUTS = 256

    def __init__(self, bindings: Sequence[tuple[EmbeddingTable, str]]) -> None:
        self._bindings = _inputs.plan_bindings(bindings, EmbeddingTable)
        self._template = np.zeros((len(self._bindings), _TASK_FIELDS), dtype=np.int64)
        for i, (table, combiner) in enumerate(self._bindings):
            self._template[i, 0] = table._handle
            self._template[i, 5] = _inputs.combiner_code(combiner)
        self._layouts: dict[tuple[tuple[int, ...], ...], _Layout] = {}

    def packed(self, spans: Sequence[tuple[int, tuple[int, ...]]]) -> _Layout:
        """The layout of ids found at (offset in int64 slots, ids shape), one per binding."""
        _inputs.check_count(spans, None, len(self._bindings))
        tasks = self._template.copy()
        shapes = []
        out_offset = ids_end = 0
        for i, ((table, _), (offset, ids_shape)) in enumerate(zip(self._bindings, spans)):
            ids_shape = _inputs.check_span(table.name, offset, ids_shape)
            shape = _inputs.output_shape(ids_shape, table.dim, int(tasks[i, 5]))
            tasks[i, 1:5] = (
                8 * offset,
                4 * out_offset,
                ids_shape[0],
                ids_shape[1] if len(ids_shape) == 2 else 1,
            )
            shapes.append(shape)
            out_offset += math.prod(shape)
            ids_end = max(ids_end, offset + math.prod(ids_shape))
        return _Layout(tasks, shapes, ids_end)

    def _layout(self, ids_list: Sequence[Any]) -> _Layout:
        spans, offset = [], 0
        for (table, _), ids in zip(self._bindings, ids_list):
            ids = _inputs.check_ids(table.name, ids)
            spans.append((offset, ids.shape))
            offset += ids.size
        layout = self.packed(spans)
        if len(self._layouts) >= self._MAX_LAYOUTS:
            self._layouts.clear()
        self._layouts[tuple(ids.shape for ids in ids_list)] = layout
        return layout

    def run(
        self, ids_list: Sequence[np.ndarray], outs: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        n = len(self._bindings)
        _inputs.check_count(ids_list, outs, n)
        if n == 0:
            return []
        try:
            layout = self._layouts[tuple([ids.shape for ids in ids_list])]
            flat = np.concatenate(ids_list, axis=None, dtype=np.int64, casting="no")
        except (AttributeError, KeyError, TypeError):
            layout = self._layout(ids_list)  # checks every id array; raises RequestError
            flat = np.concatenate(ids_list, axis=None, dtype=np.int64, casting="no")
        return self._run(flat, layout, outs)

    def run_packed(self, ids: np.ndarray, layout: _Layout) -> list[np.ndarray]:
        """Outputs for ids laid out as `layout` (from packed()) says, in one int64 buffer."""
        _inputs.check_packed(ids, layout.ids_end)
        if not len(self._bindings):
            return []
        return self._run(ids, layout, None)

    def run_packed_flat(self, ids: np.ndarray, layout: _Layout) -> np.ndarray:
        """As run_packed, with the outputs back to back (plan order, each C-ordered) in one
        float32 array: for callers that place them themselves (request_route's folded Concat)."""
        _inputs.check_packed(ids, layout.ids_end)
        return self._arena(ids, layout)

    def _arena(self, flat: np.ndarray, layout: _Layout) -> np.ndarray:
        arena = np.empty(layout.out_size, dtype=np.float32)
        if layout.n:
            _check(_LIB.rs_lookup_at(layout.tasks_address, layout.n, _address(flat), _address(arena)), "lookup")
        return arena

    def _run(self, flat: np.ndarray, layout: _Layout, outs: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        if outs is None:
            arena = self._arena(flat, layout)
            results: list[np.ndarray] = []
            for start, stop, shape in layout.runs:
                results.extend(arena[start:stop].reshape(shape))
            return results
        results = [
            _inputs.check_out(table.name, out, shape)
            for (table, _), out, shape in zip(self._bindings, outs, layout.shapes)
        ]
        tasks = layout.tasks.copy()
        tasks[:, 1] += _address(flat)
        tasks[:, 2] = [_address(out) for out in results]
        _check(_LIB.rs_lookup(_address(tasks), len(self._bindings)), "lookup")
        return results


def string_keys(values: Sequence[bytes | str] | np.ndarray, buckets: int = 0) -> np.ndarray:
    """The keys of strings: XXH64, or with `buckets` > 0 TensorFlow's StringToHashBucketFast
    (Fingerprint64 modulo buckets); the empty string is padding (-1) either way."""
    data, starts, lengths, shape = _inputs.flatten_strings(values)
    keys = np.empty(len(lengths), dtype=np.int64)
    buffer = np.frombuffer(data, dtype=np.uint8) if data else np.zeros(1, dtype=np.uint8)
    if buckets > 0:
        _LIB.rs_bucket_batch(_address(buffer), _address(starts), _address(lengths), len(lengths), buckets,
                             _address(keys))
    else:
        _LIB.rs_xxh64_batch(_address(buffer), _address(starts), _address(lengths), len(lengths), _address(keys))
    return keys.reshape(shape)


def string_keys_at(data: bytes, spans: np.ndarray, buckets: int = 0) -> None:
    """string_keys of the n strings data[start:start + length] that `spans` (int64,
    C-contiguous, 2n values: start, length, start, length, ...) names, written over the
    first n values of `spans` (the request parser's layout, hashed without building them)."""
    if buckets > 0:
        _LIB.rs_bucket_spans(data, _address(spans), len(spans) // 2, buckets, _address(spans))
    else:
        _LIB.rs_xxh64_spans(data, _address(spans), len(spans) // 2, _address(spans))


def default_vectors(spec: DefaultSpec, keys: np.ndarray, dim: int) -> np.ndarray:
    dim = _inputs.check_dim("default_vectors", dim)
    spec = _inputs.check_default("default_vectors", spec, dim)
    keys = _inputs.check_keys("default_vectors", keys).reshape(-1)
    if spec.matrix is not None:
        return _inputs.matrix_rows(spec.matrix, keys)
    out = np.zeros((len(keys), dim), dtype=np.float32)
    if spec.kind == "normal":
        _LIB.rs_default_vectors(
            spec.stddev, _inputs.seed_u64(spec), _address(keys), len(keys), dim, _address(out)
        )
    return out
