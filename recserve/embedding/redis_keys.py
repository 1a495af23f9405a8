"""Where a model's embedding rows and control keys live in Redis, and how rows are encoded.

Layout (names are percent-encoded, so ``:``, ``{`` and ``}`` never appear inside one)::

    rs:<model>:<version>:<table>:<key hex>    one row: 4*dim bytes, float32 little-endian
    rs:{<model>}:ready:<version>              JSON: global_step, tables {name: {dim, rows}}
    rs:{<model>}:lock:<version>               the import lock: a token, with an expiry
    rs:{<model>}:sample:<version>:<table>     up to 4,096 of the table's keys, int64 LE
    rs:{<model>}:versions                     sorted set: imported versions by global_step
    rs:{<model>}:updates                      the stream of real-time row updates

`<key hex>` is the int64 key's two's-complement bits as 16 lowercase hex digits, big-endian
(key 1000 -> ``00000000000003e8``). A key per row makes one MGET fetch a whole batch on a
single Redis, and lets a Redis Cluster spread one table's rows over every slot; the control
keys share the hash tag ``{<model>}``, so they sit in one slot and a MULTI may span them.
A version's rows are written beside the serving version's under their own prefix, so a
replica switches versions by switching the prefix it reads. Pure functions; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast
from urllib.parse import quote

import numpy as np

__all__ = ["KeySpace", "decode_rows", "encode_rows", "row_keys"]

_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)


def _name(text: str) -> str:
    return quote(text, safe="/")


@dataclass(frozen=True)
class KeySpace:
    """The key names of one model. Immutable; thread-safe."""

    model: str

    @property
    def _tag(self) -> str:
        return f"rs:{{{_name(self.model)}}}"

    def row_prefix(self, version: str, table: str) -> bytes:
        return f"rs:{_name(self.model)}:{_name(version)}:{_name(table)}:".encode()

    def version_pattern(self, version: str) -> str:
        """A SCAN pattern matching every row key of `version` (all its tables)."""
        return f"rs:{_name(self.model)}:{_name(version)}:*"  # quoting leaves no glob characters

    def sample_pattern(self, version: str) -> str:
        """A SCAN pattern matching the sample keys of every table of `version`."""
        return f"{self.sample(version, '')}*"

    def ready(self, version: str) -> str:
        return f"{self._tag}:ready:{_name(version)}"

    def lock(self, version: str) -> str:
        return f"{self._tag}:lock:{_name(version)}"

    def delta(self, version: str, global_step: int | str) -> str:
        """Set once a replica has written the delta of `version` at `global_step` to Redis."""
        return f"{self._tag}:delta:{_name(version)}:{global_step}"

    def delta_pattern(self, version: str) -> str:
        return self.delta(version, "*")

    def sample(self, version: str, table: str) -> str:
        return f"{self._tag}:sample:{_name(version)}:{_name(table)}"

    @property
    def versions(self) -> str:
        return f"{self._tag}:versions"

    @property
    def updates(self) -> str:
        return f"{self._tag}:updates"


def row_keys(prefix: bytes, keys: np.ndarray) -> list[bytes]:
    """The Redis key of every int64 in `keys`, built by numpy (no Python loop per key)."""
    raw = np.ascontiguousarray(keys, dtype=">i8").view(np.uint8).reshape(-1, 8)
    width = len(prefix) + 16
    out = np.empty((len(raw), width), dtype=np.uint8)
    out[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    out[:, len(prefix) :: 2] = _HEX[raw >> 4]
    out[:, len(prefix) + 1 :: 2] = _HEX[raw & 15]
    # Hex digits are never NUL, which an "S" dtype would strip from the end.
    return cast(list[bytes], out.view(f"S{width}").ravel().tolist())


def encode_rows(values: np.ndarray) -> list[bytes]:
    """Each row of a float32 [N, dim] array as 4*dim little-endian bytes."""
    rows = np.ascontiguousarray(values, dtype="<f4")
    return cast(list[bytes], rows.view(np.dtype((np.void, 4 * rows.shape[1]))).ravel().tolist())


def decode_rows(replies: list[bytes | None], dim: int, where: str) -> tuple[np.ndarray, np.ndarray]:
    """(found bool [N], float32 [found.sum(), dim]) from an MGET reply; None = no such row.

    Raises ValueError naming `where` if a row does not have 4*dim bytes."""
    arr = np.array(replies, dtype=object)
    found = np.asarray(arr != None, dtype=np.bool_)
    data = b"".join(arr[found].tolist())
    count = int(found.sum())
    if len(data) != 4 * dim * count:
        raise ValueError(
            f"{where}: rows in Redis are not {4 * dim} bytes (float32 x dim {dim}) each; "
            "the namespace holds data recserve did not write"
        )
    return found, np.frombuffer(data, dtype="<f4").astype(np.float32).reshape(count, dim)
