"""One copy of the tables for every worker process (DESIGN §9): the engine's shared arena.

The leader of `recserve serve --workers N` calls `reserve()` before it forks anything; from
then on every table it builds lives in one MAP_SHARED range that its forked workers see at
the same address, so a worker serves a table from its handle alone (`EmbeddingTable.attach`)
without a copy of the rows. A worker calls `detach(k)` right after the fork: it only reads,
counting its reads in its own slot of each table's epoch, which the leader resets
(`forget_reader`) once the worker died.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

import numpy as np

from recserve.errors import ConfigError
from recserve.model_store import row_memory

__all__ = ["MAX_WORKERS", "active", "contains", "default_size", "detach", "forget_reader", "reserve", "stats"]

_state = {"reserved": False, "allocating": False}


def _lib() -> Any:
    if os.environ.get("RECSERVE_PURE_PYTHON") == "1":
        raise ConfigError("worker processes share tables through the native engine; unset RECSERVE_PURE_PYTHON")
    from recserve.embedding._native import _LIB

    return _LIB


def _declare(lib: Any) -> None:
    lib.rs_arena_reserve.restype = ctypes.c_void_p
    lib.rs_arena_reserve.argtypes = [ctypes.c_int64]
    lib.rs_arena_detach.restype = None
    lib.rs_arena_detach.argtypes = []
    lib.rs_arena_contains.restype = ctypes.c_int
    lib.rs_arena_contains.argtypes = [ctypes.c_void_p]
    lib.rs_arena_stats.restype = None
    lib.rs_arena_stats.argtypes = [ctypes.c_void_p]
    lib.rs_arena_alloc.restype = ctypes.c_void_p
    lib.rs_arena_alloc.argtypes = [ctypes.c_int64]
    lib.rs_arena_free.restype = None
    lib.rs_arena_free.argtypes = [ctypes.c_void_p]
    lib.rs_set_reader_slot.restype = ctypes.c_int
    lib.rs_set_reader_slot.argtypes = [ctypes.c_int32]
    lib.rs_reset_reader_slot.restype = None
    lib.rs_reset_reader_slot.argtypes = [ctypes.c_int32]


# Reader slots of the engine's epoch (native/embedding.h): the leader reads in slot 0,
# worker k in slot k + 1.
READER_SLOTS = 256
MAX_WORKERS = READER_SLOTS - 1


def default_size() -> int:
    """Address space to reserve: RECSERVE_SHARED_ARENA_BYTES, else 4x the machine's memory
    (only pages written cost memory; the rest is address space, of which x86-64 has 128 TiB)."""
    configured = os.environ.get("RECSERVE_SHARED_ARENA_BYTES")
    if configured:
        try:
            value = int(configured)
        except ValueError:
            value = 0
        if value <= 0:
            raise ConfigError(f"RECSERVE_SHARED_ARENA_BYTES must be a positive integer, got {configured!r}")
        return value
    return 4 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def reserve(size: int | None = None) -> None:
    """Map the shared range and build every later table in it (this process: the leader)."""
    lib = _lib()
    _declare(lib)
    nbytes = default_size() if size is None else size
    if not _state["reserved"]:
        if not lib.rs_arena_reserve(nbytes):
            raise ConfigError(
                f"cannot reserve {nbytes} bytes of shared address space for the worker processes' tables "
                "(ulimit -v?); set RECSERVE_SHARED_ARENA_BYTES lower")
        _state["reserved"] = True
    _state["allocating"] = True
    row_memory.set_allocator(_SharedRows(lib))


def detach(worker: int) -> None:
    """In worker `worker` (0-based) just forked: never allocate or free arena memory (tables
    of its own, none normally, go to the heap), and count reads in the worker's own slot of
    every table's epoch, so that its death mid-read can be forgotten (`forget_reader`)."""
    lib = _lib()
    _declare(lib)
    if not 0 <= worker or lib.rs_set_reader_slot(worker + 1) != 0:  # the engine checks the range
        raise ConfigError(f"worker index {worker} is out of range: at most {MAX_WORKERS} worker processes")
    if _state["reserved"]:
        lib.rs_arena_detach()
    _state["allocating"] = False
    row_memory.set_allocator(None)


def forget_reader(worker: int) -> None:
    """In the leader, once worker `worker` is dead and before its replacement starts: a read
    it left unfinished no longer holds back the reclamation of any table's retired rows."""
    lib = _lib()
    _declare(lib)
    lib.rs_reset_reader_slot(worker + 1)


def active() -> bool:
    """True in the leader once reserved: tables built here are shared."""
    return _state["allocating"]


def contains(address: int) -> bool:
    return bool(_state["reserved"] and _lib().rs_arena_contains(address))


def stats() -> dict[str, int]:
    """reserved / allocated / peak bytes of the arena, and its free extents."""
    out = np.zeros(4, dtype=np.int64)
    if _state["reserved"]:
        _lib().rs_arena_stats(out.ctypes.data)
    return dict(zip(("reserved", "allocated", "peak", "free_extents"), out.tolist()))


class _ArenaBlock:
    """Owns one arena block; numpy arrays over it keep it alive and free it with the last."""

    def __init__(self, lib: Any, nbytes: int) -> None:
        self._lib = lib
        self.address = lib.rs_arena_alloc(max(nbytes, 1))
        if not self.address:
            raise MemoryError(f"the shared arena has no room for {nbytes} more bytes of table rows "
                              "(RECSERVE_SHARED_ARENA_BYTES)")
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (self.address, False),
                                    "version": 3}

    def __del__(self) -> None:
        if self.address:
            self._lib.rs_arena_free(self.address)
            self.address = 0


class _SharedRows:
    def __init__(self, lib: Any) -> None:
        self._lib = lib

    def empty(self, n: int, dim: int) -> np.ndarray:
        block = _ArenaBlock(self._lib, n * dim * 4)
        return np.asarray(block).view(np.float32)[: n * dim].reshape(n, dim)

    def holds(self, array: np.ndarray) -> bool:
        return bool(self._lib.rs_arena_contains(array.ctypes.data))
