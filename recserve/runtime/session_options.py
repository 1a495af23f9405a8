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

__all__ = ["SessionOptionValues", "ThreadSettings", "build_session_options", "session_option_values"]


@dataclass(frozen=True, kw_only=True)
class ThreadSettings:
    """How one session runs on the CPU; immutable."""

    intra: int = 0
    inter: int = 0
    per_session_threads: bool = True
    inline: bool = False
    spinning: bool = False
    cpus: tuple[int, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SessionOptionValues:
    """What one session is told, for either binding: the Python `SessionOptions` here and
    the C API in recserve.runtime.native_runner. None: ONNX Runtime's default."""

    intra: int | None = None
    inter: int | None = None
    parallel: bool = False
    per_session_threads: bool = True
    log_severity: int = 3
    config: tuple[tuple[str, str], ...] = ()


def session_option_values(
    threads: ThreadSettings, *, prepacking: bool = False, log_severity: int = 3
) -> SessionOptionValues:
    config: list[tuple[str, str]] = []
    if not prepacking:
        config.append(("session.disable_prepacking", "1"))
    if threads.inline:
        return SessionOptionValues(intra=1, inter=1, log_severity=log_severity, config=tuple(config))
    if not threads.per_session_threads:
        return SessionOptionValues(per_session_threads=False, log_severity=log_severity, config=tuple(config))
    intra = threads.intra or len(threads.cpus)
    spin = "1" if threads.spinning else "0"
    config += [("session.intra_op.allow_spinning", spin), ("session.inter_op.allow_spinning", spin)]
    if threads.cpus and intra > 1:
        config.append(("session.intra_op_thread_affinities", intra_op_affinities(threads.cpus, intra)))
    return SessionOptionValues(
        intra=intra, inter=threads.inter, parallel=threads.inter > 1, log_severity=log_severity, config=tuple(config)
    )


def build_session_options(
    threads: ThreadSettings, *, prepacking: bool = False, log_severity: int = 3
) -> ort.SessionOptions:
    values = session_option_values(threads, prepacking=prepacking, log_severity=log_severity)
    options = ort.SessionOptions()
    options.log_severity_level = values.log_severity
    if not values.per_session_threads:
        options.use_per_session_threads = False
    if values.intra is not None:
        options.intra_op_num_threads = values.intra
    if values.inter is not None:
        options.inter_op_num_threads = values.inter
    options.execution_mode = ort.ExecutionMode.ORT_PARALLEL if values.parallel else ort.ExecutionMode.ORT_SEQUENTIAL
    for key, value in values.config:
        options.add_session_config_entry(key, value)
    return options
