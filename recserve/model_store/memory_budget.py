"""Will a full version fit in memory? Checked before it is built, so a swap never OOMs.

A full swap builds the new version beside the serving one: for a while both are in memory.
A pod that is then killed by its memory limit serves nothing, which is worse than serving
the old version a while longer. So before building, the version's memory is estimated from
its manifest's file sizes (table files x `TABLE_FACTOR`: the rows in the engine's layout plus
its hash index, measured here at 1.57x the float rows for dim 16, i.e. ~1.14x a safetensors
file that also holds keys, freqs and versions; other files 1x) and compared with the memory
the process may still take: the cgroup's `memory.max - memory.current` (v2; v1's
limit/usage likewise) where a limit is set, and the host's MemAvailable.
`RECSERVE_AVAILABLE_MEMORY_BYTES` replaces the measurement (tests, or an operator who knows
better). Pure functions over /proc and /sys; thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from recserve.errors import ConfigError, ModelLoadError
from recserve.model_store.manifest import Manifest

__all__ = ["TABLE_FACTOR", "MemoryBudgetError", "available_memory", "check_fits", "version_bytes"]

TABLE_FACTOR = 1.25  # ~1.14 measured, plus room for the allocator and load-time copies
OVERRIDE_ENV = "RECSERVE_AVAILABLE_MEMORY_BYTES"


class MemoryBudgetError(ModelLoadError):
    """The version would not fit in the memory the process may still use."""


def version_bytes(manifest: Manifest) -> int:
    """The memory a version's files are estimated to take once built."""
    total = 0.0
    for name, entry in manifest.files.items():
        total += entry.size * (TABLE_FACTOR if name.startswith("embedding/") else 1.0)
    return int(total)


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_room(root: Path) -> int | None:
    limit, used = _read_int(root / "memory.max"), _read_int(root / "memory.current")
    if limit is None:  # cgroup v1
        limit, used = _read_int(root / "memory" / "memory.limit_in_bytes"), _read_int(
            root / "memory" / "memory.usage_in_bytes")
        if limit is not None and limit >= 1 << 60:  # v1 writes "no limit" as a huge number
            limit = None
    if limit is None or used is None:
        return None
    return max(0, limit - used)


def _mem_available(meminfo: Path) -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_memory(env: Mapping[str, str] | None = None, *, cgroup: Path = Path("/sys/fs/cgroup"),
                     meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes the process may still allocate; None when nothing says."""
    env = os.environ if env is None else env
    raw = env.get(OVERRIDE_ENV)
    if raw is not None:
        if not raw.isdigit():
            raise ConfigError(f"{OVERRIDE_ENV} must be a byte count, got {raw!r}")
        return int(raw)
    rooms = [r for r in (_cgroup_room(cgroup), _mem_available(meminfo)) if r is not None]
    return min(rooms) if rooms else None


def check_fits(manifest: Manifest, where: str, available: int | None) -> None:
    """Raise MemoryBudgetError when the version at `where` is estimated not to fit."""
    if available is None:
        return
    needed = version_bytes(manifest)
    if needed > available:
        raise MemoryBudgetError(
            f"version {where} needs an estimated {needed / 2**20:,.0f} MiB to build beside the serving "
            f"version, but the process may use only {available / 2**20:,.0f} MiB more (cgroup memory.max "
            f"minus memory.current, or MemAvailable); not built, the serving version stays, and it is "
            f"tried again at the next poll"
        )
