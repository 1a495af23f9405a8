"""The pure-Python (numpy) twin of the native engine: the same API and the same bits, written
for clarity rather than speed. It is the executable specification the test suite runs the
native engine against, and the fallback where the C library cannot be built
(``RECSERVE_PURE_PYTHON=1``)."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recserve.embedding import _inputs, tiers
from recserve.embedding._purekeys import default_rows, string_bucket, string_key
from recserve.embedding._puretier import TierStore
from recserve.model_spec import COMBINERS, DefaultSpec

_MISSING = -1


class EmbeddingTable:
    """int64 key -> float32 row of `dim`, with a default for unknown keys.

    With `storage` (a TierSpec) the rows live in a TierStore (_puretier.py): a record file
    and a DRAM tier, with the native engine's semantics.

    Thread-safety: lookup, contains, snapshot and sample_keys may run from any number of
    threads concurrently with upsert/delete (writers serialise on an internal lock). A key's
    row is written to a fresh slot before the key is pointed at it, and slots are never
    reused, so a reader sees each row entirely old or entirely new. close() must not race
    with any other call.
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
        self._name = name
        where = f"table {name!r}"
        self._dim = _inputs.check_dim(where, dim)
        self._default = _inputs.check_default(where, default, self._dim)
        self._storage = storage
        self._tier: TierStore | None = None
        keys, values = _inputs.check_rows(where, self._dim, keys, values, adopt=storage is None)
        _inputs.check_column(where, "freqs", freqs, len(keys))
        _inputs.check_column(where, "versions", versions, len(keys))
        duplicate = _inputs.duplicate_key(keys)
        if duplicate is not None:
            raise _inputs.DuplicateKeyError(name, duplicate)
        if storage is not None:
            self._tier = TierStore(where, self._dim, keys, values, freqs, storage)
            self._writer = self._tier.lock
            return
        self._base = values  # slots [0, N): the adopted values
        self._extra = np.empty((0, self._dim), dtype=np.float32)  # slots N.. (grows by copy)
        self._extra_used = 0
        self._slots: dict[int, int] = dict(zip(keys.tolist(), range(len(keys))))
        self._writer = threading.Lock()

    @property
    def name(self) -> str:
        return self._name

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def default(self) -> DefaultSpec:
        return self._default

    @property
    def storage(self) -> tiers.TierSpec | None:
        return self._storage

    def __len__(self) -> int:
        return len(self._tier) if self._tier is not None else len(self._slots)

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        """Deletes a tiered table's files; idempotent. No call may race with or follow it."""
        tier, self._tier = getattr(self, "_tier", None), None
        if tier is not None:
            tier.close()

    def tier_stats(self) -> dict[str, int] | None:
        return None if self._tier is None else self._tier.tier_stats()

    def _maintain(self) -> None:
        if self._tier is not None:
            self._tier.maintain()

    def _compact(self) -> None:
        if self._tier is not None:
            self._tier.compact()

    def _resolve(self, keys: np.ndarray) -> np.ndarray:
        get = self._slots.get
        return np.fromiter(
            (get(k, _MISSING) for k in keys.tolist()), dtype=np.int64, count=keys.size
        )

    def _rows(self, keys: np.ndarray) -> np.ndarray:
        """[n, dim]: the row of each key, zeros for padding, the default for unknown keys."""
        if self._tier is not None:
            rows, found = self._tier.rows(keys)
            return self._with_defaults(keys, rows, ~found)
        slots = self._resolve(keys)
        # Read the storage only after resolving: any slot seen is already in it.
        base, extra = self._base, self._extra
        rows = np.zeros((keys.size, self._dim), dtype=np.float32)
        in_base = (slots >= 0) & (slots < len(base))
        in_extra = slots >= len(base)
        rows[in_base] = base[slots[in_base]]
        rows[in_extra] = extra[slots[in_extra] - len(base)]
        return self._with_defaults(keys, rows, slots == _MISSING)

    def _with_defaults(self, keys: np.ndarray, rows: np.ndarray, absent: np.ndarray) -> np.ndarray:
        unknown = absent & (keys != _inputs.PADDING)
        if self._default.kind != "zeros" and unknown.any():
            rows[unknown] = default_vectors(self._default, keys[unknown], self._dim)
        return rows

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
        rows = self._rows(ids.reshape(-1))
        if code == _inputs.NONE:
            out[...] = rows.reshape(shape)
            return out
        grid = ids if ids.ndim == 2 else ids[:, None]
        rows = rows.reshape(*grid.shape, self._dim)
        pooled = np.zeros((len(grid), self._dim), dtype=np.float32)
        for position in range(grid.shape[1]):  # in id order: float32 sums are order-sensitive
            pooled += rows[:, position]  # padding rows are +0.0, which adds nothing
        counts = (grid != _inputs.PADDING).sum(axis=1).astype(np.float32)
        some = counts > 0
        if COMBINERS[code] == "mean":
            pooled[some] /= counts[some, None]
        elif COMBINERS[code] == "sqrtn":
            pooled[some] /= np.sqrt(counts[some])[:, None]
        out[...] = pooled
        return out

    def contains(self, keys: np.ndarray) -> np.ndarray:
        keys = _inputs.check_keys(f"table {self._name!r}", keys)
        if self._tier is not None:
            return self._tier.contains(keys.reshape(-1)).reshape(keys.shape)
        found: np.ndarray = self._resolve(keys.reshape(-1)) != _MISSING
        return found.reshape(keys.shape)

    def sample_keys(self, n: int, rng: np.random.Generator) -> np.ndarray:
        keys = np.array(self._stored_keys(), dtype=np.int64)
        if n > 0 and len(keys) == 0:
            raise ValueError(f"table {self._name!r} has no rows to sample keys from")
        return rng.choice(keys, size=n) if n > 0 else np.empty(0, dtype=np.int64)

    def upsert(self, keys: np.ndarray, values: np.ndarray) -> None:
        keys, values = _inputs.check_rows(f"table {self._name!r}", self._dim, keys, values)
        if self._tier is not None:
            with self._writer:
                self._tier.upsert(keys, values)
            return
        with self._writer:
            start, need = self._extra_used, self._extra_used + len(keys)
            if need > len(self._extra):
                grown = np.empty((max(need, 2 * len(self._extra), 1024), self._dim), np.float32)
                grown[:start] = self._extra[:start]
                self._extra = grown  # published before any key points into it
            self._extra[start:need] = values
            self._extra_used = need
            first = len(self._base) + start
            self._slots.update(zip(keys.tolist(), range(first, first + len(keys))))

    def delete(self, keys: np.ndarray) -> None:
        keys = _inputs.check_keys(f"table {self._name!r}", keys)
        if self._tier is not None:
            with self._writer:
                self._tier.delete(keys)
            return
        with self._writer:
            for key in keys.reshape(-1).tolist():
                self._slots.pop(key, None)

    def keys(self) -> np.ndarray:
        return np.array(self._stored_keys(), dtype=np.int64)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        keys = np.array(self._stored_keys(), dtype=np.int64)
        return keys, self._rows(keys)

    def _stored_keys(self) -> list[int]:
        return self._tier.keys() if self._tier is not None else list(self._slots)


class LookupPlan:
    """Looks up all embedding bindings of a request; see the native LookupPlan.

    Thread-safety: immutable; run() may be called from any number of threads.
    """

    def __init__(self, bindings: Sequence[tuple[EmbeddingTable, str]]) -> None:
        self._bindings = _inputs.plan_bindings(bindings, EmbeddingTable)

    def run(
        self, ids_list: Sequence[np.ndarray], outs: Sequence[np.ndarray] | None = None
    ) -> list[np.ndarray]:
        _inputs.check_count(ids_list, outs, len(self._bindings))
        return [
            table.lookup(ids, combiner, None if outs is None else outs[i])
            for i, ((table, combiner), ids) in enumerate(zip(self._bindings, ids_list))
        ]

    def packed(self, spans: Sequence[tuple[int, tuple[int, ...]]]) -> _PackedLayout:
        _inputs.check_count(spans, None, len(self._bindings))
        checked = [
            (int(offset), _inputs.check_span(table.name, offset, shape))
            for (table, _), (offset, shape) in zip(self._bindings, spans)
        ]
        end = max((offset + math.prod(shape) for offset, shape in checked), default=0)
        return _PackedLayout(tuple(checked), end)

    def run_packed(self, ids: np.ndarray, layout: _PackedLayout) -> list[np.ndarray]:
        _inputs.check_packed(ids, layout.ids_end)
        return self.run([ids[o:o + math.prod(shape)].reshape(shape) for o, shape in layout.spans])

    def run_packed_flat(self, ids: np.ndarray, layout: _PackedLayout) -> np.ndarray:
        outs = self.run_packed(ids, layout)
        return np.concatenate([o.ravel() for o in outs]) if outs else np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class _PackedLayout:
    spans: tuple[tuple[int, tuple[int, ...]], ...]
    ids_end: int


def string_keys(values: Sequence[bytes | str] | np.ndarray, buckets: int = 0) -> np.ndarray:
    data, starts, lengths, shape = _inputs.flatten_strings(values)
    key = string_key if buckets <= 0 else lambda b: string_bucket(b, buckets)
    keys = [key(data[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]
    return np.array(keys, dtype=np.int64).reshape(shape)


def string_keys_at(data: bytes, spans: np.ndarray, buckets: int = 0) -> None:
    pairs = spans.tolist()
    n = len(pairs) // 2
    key = string_key if buckets <= 0 else lambda b: string_bucket(b, buckets)
    spans[:n] = [key(data[s : s + k]) for s, k in zip(pairs[0::2], pairs[1::2])]


def default_vectors(spec: DefaultSpec, keys: np.ndarray, dim: int) -> np.ndarray:
    dim = _inputs.check_dim("default_vectors", dim)
    spec = _inputs.check_default("default_vectors", spec, dim)
    keys = _inputs.check_keys("default_vectors", keys).reshape(-1)
    if spec.kind == "zeros":
        return np.zeros((len(keys), dim), dtype=np.float32)
    if spec.matrix is not None:
        return _inputs.matrix_rows(spec.matrix, keys)
    return default_rows(spec.stddev, _inputs.seed_u64(spec), keys, dim)
