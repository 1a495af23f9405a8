"""ONNX Runtime `SessionOptions` for one session of a group: threads, affinity, spinning,
inline execution and prepacking.

Mapping from DeepRec's fields (docs/sessions.md has the user's view):
- intra/inter threads: per-session pool sizes (0 = ONNX Runtime's default); inter > 1
  turns on ONNX Runtime's parallel executor, which is what inter-op threads are for.
- inline execution: one thread, sequential executor: the whole run happens on the
  calling thread and the session starts no thread at all.
- cpus: the session's CPU group; with no intra size given the pool gets one thread per
  CPU of the group, and its workers are pinned to the group.
- global pools (`per_session_threads=False`): the session uses the process-wide pools.
- spinning: idle pool threads busy-wait for work. Off by default: on a shared machine it
  burns the cores the other sessions and the embedding engine need (BENCHMARKS.md).
- prepacking: MatMul/Gemm weights repacked per session. Off by default so that every
  session uses the one shared copy of each weight.
Pure function; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnxruntime as ort

from recserve.runtime.cpus import intra_op_affinities

__all__ = ["ThreadSettings", "build_session_options"]


@dataclass(frozen=True, kw_only=True)
class ThreadSettings:
    """How one session runs on the CPU; immutable."""

    intra: int = 0
    inter: int = 0
    per_session_threads: bool = True
    inline: bool = False
    spinning: bool = False
    cpus: tuple[int, ...] = ()


def build_session_options(
    threads: ThreadSettings, *, prepacking: bool = False, log_severity: int = 3
) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.log_severity_level = log_severity
    if not prepacking:
        options.add_session_config_entry("session.disable_prepacking", "1")
    if threads.inline:
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        return options
    if not threads.per_session_threads:
        options.use_per_session_threads = False
        return options
    intra = threads.intra or len(threads.cpus)
    options.intra_op_num_threads = intra
    options.inter_op_num_threads = threads.inter
    if threads.inter > 1:
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    spin = "1" if threads.spinning else "0"
    options.add_session_config_entry("session.intra_op.allow_spinning", spin)
    options.add_session_config_entry("session.inter_op.allow_spinning", spin)
    if threads.cpus and intra > 1:
        options.add_session_config_entry(
            "session.intra_op_thread_affinities", intra_op_affinities(threads.cpus, intra)
        )
    return options

