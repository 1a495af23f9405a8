"""Argument checks and normalisation shared by the native engine and its pure-Python twin,
so both accept the same inputs and fail with the same messages.

Problems with request data (the ids) raise ``RequestError`` (status 400); problems with
what the caller set up (table contents, combiner names, ``out`` buffers) raise ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from recserve.errors import RequestError
from recserve.model_spec import COMBINERS, DefaultSpec
from recserve.model_store import row_memory
from recserve.model_store.row_memory import empty_rows

COMBINER_CODES = {name: code for code, name in enumerate(COMBINERS)}  # matches RS_COMBINER_*
NONE = COMBINER_CODES["none"]
PADDING = -1
ZEROS = DefaultSpec()  # the default default: unknown keys get zeros
_U64 = (1 << 64) - 1


def combiner_code(combiner: str) -> int:
    code = COMBINER_CODES.get(combiner) if isinstance(combiner, str) else None
    if code is None:
        raise ValueError(f"combiner {combiner!r} is not one of {list(COMBINERS)}")
    return code


def _describe(a: Any) -> str:
    if not isinstance(a, np.ndarray):
        return type(a).__name__
    layout = "C-contiguous" if a.flags.c_contiguous else "non-contiguous"
    access = "" if a.flags.writeable else ", read-only"
    return f"{a.dtype} array of shape {list(a.shape)} ({layout}{access})"


def check_ids(table: str, ids: Any) -> np.ndarray:
    """Request ids for one table: a C-contiguous int64 array of shape [B] or [B, L]."""
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int64:
        raise RequestError(
            f"ids for table {table!r} must be an int64 numpy array, got {_describe(ids)}"
        )
    if ids.ndim not in (1, 2):
        raise RequestError(
            f"ids for table {table!r} must have shape [B] or [B, L], got shape {list(ids.shape)}"
        )
    return np.ascontiguousarray(ids)


def check_span(table: str, offset: Any, shape: Any) -> tuple[int, ...]:
    """Where a packed plan finds one binding's ids: a slot offset >= 0 and a shape [B] or [B, L]."""
    if not isinstance(offset, (int, np.integer)) or offset < 0:
        raise ValueError(f"ids for table {table!r}: offset must be an integer >= 0, got {offset!r}")
    shape = tuple(int(d) for d in shape)
    if len(shape) not in (1, 2) or min(shape) < 0:
        raise RequestError(
            f"ids for table {table!r} must have shape [B] or [B, L], got shape {list(shape)}"
        )
    return shape


def check_packed(ids: Any, end: int) -> None:
    """A packed plan's ids buffer: 1-D C-contiguous int64 with at least `end` slots."""
    if not (
        type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1
        and ids.flags.c_contiguous and ids.size >= end
    ):
        raise ValueError(
            f"packed ids must be a C-contiguous int64 array of shape [N] with N >= {end}, "
            f"got {_describe(ids)}"
        )


def output_shape(ids_shape: tuple[int, ...], dim: int, combiner: int) -> tuple[int, ...]:
    if combiner == NONE:
        return (*ids_shape, dim)
    return (ids_shape[0], dim)


def check_out(table: str, out: Any, shape: tuple[int, ...]) -> np.ndarray:
    if not (
        isinstance(out, np.ndarray)
        and out.dtype == np.float32
        and out.shape == shape
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        raise ValueError(
            f"out for table {table!r} must be a writeable C-contiguous float32 array of shape "
            f"{list(shape)}, got {_describe(out)}"
        )
    return out


def check_default(where: str, default: Any, dim: int) -> DefaultSpec:
    """A DefaultSpec the engine can serve; a "rows" one must carry its matrix (read from the
    model dir by recserve.model_store.default_rows) as C-contiguous float32 [k >= 1, dim]."""
    if not isinstance(default, DefaultSpec) or default.kind not in ("zeros", "normal", "rows"):
        raise ValueError(f"{where}: default must be a DefaultSpec of kind 'zeros', 'normal' or 'rows'")
    if default.kind == "rows":
        matrix = default.matrix
        if not (isinstance(matrix, np.ndarray) and matrix.dtype == np.float32 and matrix.ndim == 2
                and matrix.shape[0] >= 1 and matrix.shape[1] == dim and matrix.flags.c_contiguous):
            raise ValueError(f"{where}: a 'rows' default needs its matrix as a C-contiguous float32 array of "
                             f"shape [k >= 1, {dim}], got {_describe(matrix)}")
    return default


def matrix_rows(matrix: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """[len(keys), dim]: row key mod k of the "rows" default's matrix (floor modulo, so a
    negative key gets a row too; DeepRec reads out of bounds there)."""
    return matrix[np.mod(keys, len(matrix))]


def seed_u64(spec: DefaultSpec) -> int:
    """The seed as the generator uses it: reduced modulo 2**64."""
    return spec.seed & _U64


def check_keys(where: str, keys: Any, what: str = "keys") -> np.ndarray:
    """Integer keys as a C-contiguous int64 array (uint64 keys are read as two's complement)."""
    keys = np.asarray(keys)
    if keys.dtype.kind not in "iu" and not (keys.dtype.kind == "f" and keys.size == 0):
        raise ValueError(f"{where}: {what} must be integers, got {_describe(keys)}")
    return np.ascontiguousarray(keys.astype(np.int64, copy=False))


def check_rows(
    where: str, dim: int, keys: Any, values: Any, *, adopt: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """keys [N] and values [N, dim] for a table. With adopt, values already in the engine's
    layout (C-contiguous, aligned, writeable float32) are returned as they are, not copied."""
    keys = check_keys(where, keys)
    if keys.ndim != 1:
        raise ValueError(f"{where}: keys must have shape [N], got {list(keys.shape)}")
    values = np.asarray(values)
    if values.dtype.kind != "f" or values.shape != (len(keys), dim):
        raise ValueError(
            f"{where}: values must be a float array of shape [{len(keys)}, {dim}] "
            f"(one row of dim {dim} per key), got {_describe(values)}"
        )
    if (keys == PADDING).any():
        raise ValueError(f"{where}: key -1 is reserved for padding and cannot be stored")
    usable = values.dtype == np.float32 and values.flags.c_contiguous and values.flags.aligned
    allocator = row_memory.allocator()
    shared_elsewhere = allocator is not None and not allocator.holds(values)
    if adopt and not (usable and values.flags.writeable) or adopt and shared_elsewhere:
        copied = empty_rows(len(keys), dim)
        copied[...] = values
        values = copied
    elif not usable:
        values = np.ascontiguousarray(values, dtype=np.float32)
    return keys, values


def check_dim(where: str, dim: Any) -> int:
    if not isinstance(dim, (int, np.integer)) or isinstance(dim, bool) or dim <= 0:
        raise ValueError(f"{where}: dim must be a positive integer, got {dim!r}")
    return int(dim)


def check_column(where: str, what: str, column: Any, n: int) -> None:
    """freqs / versions: accepted with a checkpoint's tensors, checked, not used for serving."""
    if column is None:
        return
    column = np.asarray(column)
    if column.dtype.kind not in "iu" or column.shape != (n,):
        raise ValueError(
            f"{where}: {what} must be integers of shape [{n}], got {_describe(column)}"
        )


class DuplicateKeyError(ValueError):
    """A table's keys hold `key` more than once (raised as the table is created)."""

    def __init__(self, table: str, key: int) -> None:
        super().__init__(f"table {table!r}: key {key} occurs more than once in keys")
        self.key = key


def duplicate_key(keys: np.ndarray) -> int | None:
    """The first key, in order, that already occurred earlier in keys (None if all differ)."""
    _, first = np.unique(keys, return_index=True)
    if len(first) == len(keys):
        return None
    repeat = np.ones(len(keys), dtype=bool)
    repeat[first] = False
    return int(keys[np.flatnonzero(repeat)[0]])


def flatten_strings(
    values: Sequence[bytes | str] | np.ndarray,
) -> tuple[bytes, np.ndarray, np.ndarray, tuple[int, ...]]:
    """UTF-8 bytes of every string, concatenated: (data, starts, lengths, shape)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "SU":
        encoded = np.char.encode(values, "utf-8") if values.dtype.kind == "U" else values
        encoded = np.ascontiguousarray(encoded)
        width = encoded.dtype.itemsize
        lengths = np.char.str_len(encoded).astype(np.int64).reshape(-1)
        starts = np.arange(lengths.size, dtype=np.int64) * width
        return encoded.tobytes(), starts, lengths, values.shape
    shape = values.shape if isinstance(values, np.ndarray) else (len(values),)
    items: list[Any] = list(values.reshape(-1)) if isinstance(values, np.ndarray) else list(values)
    try:
        data = b"".join(items)
    except TypeError:
        try:
            items = [v.encode("utf-8") if isinstance(v, str) else v for v in items]
            data = b"".join(items)
        except TypeError:
            bad = next(v for v in items if not isinstance(v, (bytes, bytearray, memoryview)))
            raise RequestError(
                f"string ids must be bytes or str, got {type(bad).__name__}"
            ) from None
    lengths = np.fromiter(map(len, items), dtype=np.int64, count=len(items))
    starts = np.zeros(len(items), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    return data, starts, lengths, shape


def plan_bindings(bindings: Sequence[tuple[Any, str]], table_type: type) -> list[tuple[Any, str]]:
    """A LookupPlan's (table, combiner) pairs, checked."""
    checked = []
    for i, binding in enumerate(bindings):
        table, combiner = binding
        if not isinstance(table, table_type):
            raise TypeError(f"binding {i}: expected an EmbeddingTable, got {type(table).__name__}")
        combiner_code(combiner)
        checked.append((table, combiner))
    return checked


def check_count(ids_list: Sequence[object], outs: Sequence[object] | None, n: int) -> None:
    if len(ids_list) != n:
        raise RequestError(f"the plan has {n} bindings but {len(ids_list)} id arrays were given")
    if outs is not None and len(outs) != n:
        raise ValueError(f"the plan has {n} bindings but {len(outs)} out arrays were given")
