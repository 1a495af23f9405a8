"""How many worker processes `recserve serve --workers N|auto` runs (DESIGN §9)."""

from __future__ import annotations

from collections.abc import Sequence

from recserve.config import ProcessorConfig
from recserve.embedding.shared_memory import MAX_WORKERS
from recserve.errors import ConfigError
from recserve.runtime.cpus import available_cpus

__all__ = ["worker_count"]


def threads_per_worker(configs: Sequence[ProcessorConfig]) -> int:
    """The cores one worker keeps busy: a request runs on its calling thread plus the
    session's intra-op pool, so intra_op_parallelism_threads (1 when inline or unset: at
    serving batch sizes ONNX Runtime's default pool mostly waits), the largest over models."""
    return max([1, *(1 if c.enable_inline_execute else max(1, c.intra_op_parallelism_threads) for c in configs)])


def worker_count(value: int | str, configs: Sequence[ProcessorConfig]) -> int:
    """N, or for "auto": the CPUs this process may use divided by `threads_per_worker`."""
    if value == "auto":
        return max(1, min(MAX_WORKERS, len(available_cpus()) // threads_per_worker(configs)))
    try:
        count = int(value)
    except (TypeError, ValueError):
        count = 0
    if count < 1 or str(value).strip() != str(count):
        raise ConfigError(f"--workers must be a positive integer or 'auto', got {value!r}", field="workers")
    if count > MAX_WORKERS:
        # Each worker counts its reads in a slot of its own in every table (native/embedding.h).
        raise ConfigError(f"--workers must be at most {MAX_WORKERS}, got {count}", field="workers")
    return count
