"""`TableData`: one table's rows as a version or a delta holds them (keys, values, and the
optional columns), checked as it is built. Shared by recserve's format (checkpoint.py) and
TensorFlow bundles (tf_checkpoint.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass, replace

import numpy as np

from recserve.errors import CorruptVersionError

__all__ = ["TableData", "mod_partition_ids"]


@dataclass
class TableData:
    """One table's rows (or a delta's changed rows). Not thread-safe to mutate; the loader
    hands it over whole. Construction validates dtypes, shapes and key uniqueness and
    raises CorruptVersionError naming the problem."""

    keys: np.ndarray
    values: np.ndarray
    freqs: np.ndarray | None = None
    versions: np.ndarray | None = None
    deleted: np.ndarray | None = None
    # False: uniqueness is checked later, by require_unique() or by the embedding engine, which
    # refuses a duplicate key as it builds its index, for free. A sort of the keys costs
    # ~50 ms a million keys on one core and 8 bytes a row at the load's peak: a full
    # version's tables skip it on the way into the engine.
    check_unique: InitVar[bool] = True

    def __post_init__(self, check_unique: bool) -> None:
        _check_array("keys", self.keys, np.int64, 1)
        _check_array("values", self.values, np.float32, 2)
        n = self.keys.shape[0]
        if self.values.shape[0] != n:
            raise CorruptVersionError(
                f"values has {self.values.shape[0]} rows but keys has {n}; they must match"
            )
        for name in ("freqs", "versions"):
            arr = getattr(self, name)
            if arr is not None:
                _check_array(name, arr, np.int64, 1)
                if arr.shape[0] != n:
                    raise CorruptVersionError(
                        f"{name} has {arr.shape[0]} entries but keys has {n}; they must match"
                    )
        if self.deleted is not None:
            _check_array("deleted", self.deleted, np.int64, 1)
        self._unique_checked = False
        if check_unique:
            self.require_unique()

    def require_unique(self) -> None:
        """CorruptVersionError if a key occurs twice (checked once)."""
        if self._unique_checked:
            return
        if len(self.keys) > 1:
            ordered = np.sort(self.keys)
            dup = ordered[1:][ordered[1:] == ordered[:-1]]
            if dup.size:
                raise CorruptVersionError(
                    f"keys holds {dup.size} duplicate(s), e.g. {int(dup[0])}; keys must be unique"
                )
        self._unique_checked = True

    @property
    def dim(self) -> int:
        return int(self.values.shape[1])

    def tensors(self) -> dict[str, np.ndarray]:
        """The tensors as stored in a table file."""
        out = {"keys": self.keys, "values": self.values}
        for name in ("freqs", "versions", "deleted"):
            arr = getattr(self, name)
            if arr is not None:
                out[name] = arr
        return out


def _check_array(name: str, arr: object, dtype: type, ndim: int) -> None:
    if not isinstance(arr, np.ndarray):
        raise CorruptVersionError(f"{name} is a {type(arr).__name__}; expected a numpy array")
    if arr.dtype != dtype:
        raise CorruptVersionError(
            f"{name} has dtype {arr.dtype}; expected {np.dtype(dtype).name}"
        )
    if arr.ndim != ndim:
        raise CorruptVersionError(
            f"{name} has shape {list(arr.shape)}; expected {ndim} dimension(s)"
        )


def mod_partition_ids(data: TableData, partitions: Sequence[int], where: str) -> TableData:
    """`data` keyed by row index of a variable partitioned in parts of `partitions` rows
    (saved as their concatenation, as TensorFlow's Saver writes a partitioned variable),
    re-keyed by the id TensorFlow's partition_strategy='mod' reads there: row r of part k
    holds id r * len(partitions) + k (deleted rows too). CorruptVersionError, naming
    `where`, for a row outside the parts."""
    offsets = np.cumsum([0, *partitions])

    def ids(rows: np.ndarray) -> np.ndarray:
        outside = rows[(rows < 0) | (rows >= offsets[-1])]
        if len(outside):
            raise CorruptVersionError(f"{where}: row {int(outside[0])} is outside the {int(offsets[-1])} rows of its "
                                      f"partitions {list(partitions)}")
        part = np.searchsorted(offsets, rows, side="right") - 1
        return ((rows - offsets[part]) * len(partitions) + part).astype(np.int64, copy=False)

    deleted = None if data.deleted is None else ids(data.deleted)
    return replace(data, keys=ids(data.keys), deleted=deleted, check_unique=False)
