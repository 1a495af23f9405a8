"""One real-time row update as it travels through the model's Redis stream.

An entry of ``rs:{<model>}:updates`` has the fields ``version`` and ``table`` (UTF-8),
``keys`` (int64 little-endian), ``values`` (float32 little-endian, len(keys) x dim) and
``deleted`` (int64 little-endian, possibly empty). The writer has already stored the rows
in the version's namespace when it appends the entry, so the entry only tells replicas to
refresh their caches. Immutable; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from recserve.errors import CorruptVersionError

__all__ = ["RowUpdate"]


@dataclass(frozen=True)
class RowUpdate:
    version: str
    table: str
    keys: np.ndarray  # int64 [N]
    values: np.ndarray  # float32 [N, dim]
    deleted: np.ndarray  # int64 [M]

    def to_fields(self) -> dict[str, bytes]:
        return {
            "version": self.version.encode(),
            "table": self.table.encode(),
            "keys": self.keys.astype("<i8").tobytes(),
            "values": np.ascontiguousarray(self.values, dtype="<f4").tobytes(),
            "deleted": self.deleted.astype("<i8").tobytes(),
        }

    @classmethod
    def from_fields(cls, fields: Mapping[bytes, bytes], dim: int) -> RowUpdate:
        """Decode an entry whose table has `dim`; CorruptVersionError if it does not fit."""
        try:
            keys = np.frombuffer(fields[b"keys"], dtype="<i8").astype(np.int64)
            values = np.frombuffer(fields[b"values"], dtype="<f4").astype(np.float32)
            deleted = np.frombuffer(fields.get(b"deleted", b""), dtype="<i8").astype(np.int64)
            version, table = fields[b"version"].decode(), fields[b"table"].decode()
        except (KeyError, ValueError) as exc:
            raise CorruptVersionError(f"malformed row update in the Redis stream: {exc}") from exc
        if values.size != keys.size * dim:
            raise CorruptVersionError(
                f"row update for table {table!r} has {keys.size} keys but {values.size} floats; "
                f"expected {keys.size} x dim {dim}"
            )
        return cls(version, table, keys, values.reshape(keys.size, dim), deleted)
