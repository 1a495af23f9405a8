"""How recserve asks glibc's allocator to give back what closed versions freed.

A serving process allocates a version's rows, indexes and buffers, frees them a few
minutes later when the next version lands, and does so for weeks. glibc's defaults suit
short programs, and two of them showed as a server whose memory grew with every version
(RELIABILITY.md, findings 8 and 9):
- memory freed into an arena stays there: trimmed after each retired version;
- every thread that allocates gets an arena of its own, up to 8 per core (gRPC's workers,
  the loaders, the closer), and each kept a little of every version: a tiered server under
  gRPC load grew ~100 KiB a version spread over 16 arenas, and under HTTP load with a full
  version a second 110 -> 121 MiB in 4 minutes. With two arenas both stay flat.
Other libcs: every call here does nothing.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

__all__ = ["ARENA_MAX", "limit_arenas", "trim"]

# The GIL serialises most allocations anyway; the native stages that release it allocate
# little. Measured (wrk -c16, runs alternated): server CPU per request 1% lower at batch 1
# and 512, 5% lower at batch 64 than with glibc's default.
ARENA_MAX = 2
_M_ARENA_MAX = -8  # malloc.h


def _glibc(name: str) -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None), name)  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


_malloc_trim = _glibc("malloc_trim")
_mallopt = _glibc("mallopt")


def trim() -> None:
    """Hand the arenas' free pages back to the kernel (ctypes lets go of the GIL
    meanwhile, so requests go on)."""
    if _malloc_trim is not None:
        _malloc_trim(0)


def limit_arenas() -> bool:
    """Let this process (and the processes it forks) make at most ARENA_MAX arenas, unless
    the user chose a number with glibc's own MALLOC_ARENA_MAX. Call before the threads
    start: an arena, once made, stays. A process that embeds recserve (the C ABI, a Python
    host) keeps its own policy: only `recserve serve` calls this. Returns whether it was set."""
    if _mallopt is None or "MALLOC_ARENA_MAX" in os.environ:
        return False
    return bool(_mallopt(_M_ARENA_MAX, ARENA_MAX))
