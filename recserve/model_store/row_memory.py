"""Where loaded rows live: float32 [n, dim] arrays whose rows start on a cache line, the
layout the embedding engine adopts without a copy. The loader lays a version's rows out
here as it reads them; in the leader of worker processes the memory is the shared arena
(recserve.embedding.shared_memory installs it), where forked workers read the same rows."""

from __future__ import annotations

from typing import Protocol

import numpy as np

ROW_ALIGNMENT = 64  # bytes: rows start on a cache line, as native/embedding_internal.h's


class RowAllocator(Protocol):
    def empty(self, n: int, dim: int) -> np.ndarray: ...

    def holds(self, array: np.ndarray) -> bool: ...


_allocator: RowAllocator | None = None


def set_allocator(allocator: RowAllocator | None) -> None:
    global _allocator
    _allocator = allocator


def allocator() -> RowAllocator | None:
    return _allocator


def empty_rows(n: int, dim: int) -> np.ndarray:
    """An uninitialised float32 [n, dim] array whose first row starts on a cache line, the
    layout tables are fastest in (a dim-16 row is then one line, not two). Fill it and hand
    it to EmbeddingTable, which adopts it without a copy."""
    if _allocator is not None:
        return _allocator.empty(n, dim)
    items = ROW_ALIGNMENT // 4
    raw = np.empty(n * dim + items, dtype=np.float32)
    skip = (-raw.ctypes.data % ROW_ALIGNMENT) // 4
    return raw[skip:skip + n * dim].reshape(n, dim)
