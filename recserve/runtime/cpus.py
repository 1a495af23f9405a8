"""CPU groups for sessions: checking `cpusets` against this machine, ONNX Runtime's
affinity strings, and pinning the thread that calls `run`.

ONNX Runtime numbers logical processors from 1 ("1" is CPU 0) and wants one affinity
entry per intra-op *worker*: a pool of N threads has N-1 workers, because the thread
that calls `run` is the N-th and ONNX Runtime never pins it. recserve pins that thread
itself (`pin_calling_thread`). Pure functions except `pin_calling_thread`; thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from recserve.errors import ConfigError

__all__ = ["available_cpus", "check_cpusets", "intra_op_affinities", "pin_calling_thread"]


# Read at import, before recserve pins any thread: a pinned thread's own mask is narrower
# than the process's.
_PROCESS_CPUS = frozenset(os.sched_getaffinity(0))


def available_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity mask at start; containers narrow it)."""
    return _PROCESS_CPUS


def _ranges(cpus: Sequence[int]) -> str:
    out: list[str] = []
    ordered = sorted(cpus)
    start = prev = ordered[0]
    for cpu in ordered[1:] + [-2]:
        if cpu != prev + 1:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = cpu
        prev = cpu
    return ",".join(out)


def check_cpusets(groups: Sequence[Sequence[int]], available: frozenset[int] | None = None) -> None:
    """ConfigError unless every CPU of every group is one this process may use."""
    usable = available_cpus() if available is None else available
    for index, group in enumerate(groups):
        missing = sorted(set(group) - usable)
        if missing:
            raise ConfigError(
                f"cpusets group {index} ({_ranges(list(group))}) names CPU(s) {_ranges(missing)} that this "
                f"process cannot use; available CPUs are {_ranges(sorted(usable))}",
                field="cpusets",
            )


def intra_op_affinities(group: Sequence[int], intra_threads: int) -> str:
    """`session.intra_op_thread_affinities` for a pool of `intra_threads` threads on `group`.

    Each of the N-1 workers may run on any CPU of the group (the scheduler balances them
    inside it), written 1-based as ONNX Runtime expects."""
    if intra_threads < 2:
        raise ValueError("a pool of fewer than 2 threads has no workers to pin")
    one_based = _ranges([cpu + 1 for cpu in group])
    return ";".join([one_based] * (intra_threads - 1))


def pin_calling_thread(group: Sequence[int]) -> None:
    """Restrict the calling OS thread (only it: Linux applies pid 0 to the caller) to `group`.

    The pin stays: moving a thread costs ~6 us, so callers pin only when a thread changes
    group (under MOD a thread keeps its session, so that is once)."""
    os.sched_setaffinity(0, group)
