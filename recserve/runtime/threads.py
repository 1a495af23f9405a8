"""Process-wide thread settings: OpenMP environment and ONNX Runtime's global pools.

OpenMP runtimes read OMP_NUM_THREADS and KMP_BLOCKTIME once, when they are loaded, so
`apply_thread_environment` must run before any library that uses OpenMP is (in the
C ABI path: before the first `initialize` builds anything). The onnxruntime wheels on
PyPI do not use OpenMP; the variables matter for custom builds and for libraries the
model's custom ops load. ONNX Runtime's global pools can be created once per process;
the first model that asks for them sets their sizes, and from then on ONNX Runtime
refuses to create a session with its own pools anywhere in the process. Thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping

import onnxruntime as ort

from recserve.errors import ConfigError

__all__ = [
    "apply_thread_environment",
    "global_thread_pools",
    "loaded_openmp_runtimes",
    "use_global_thread_pools",
]

log = logging.getLogger("recserve.runtime")

_OPENMP_LIBRARIES = ("libgomp", "libiomp5", "libomp.so", "libomp-")
_lock = threading.Lock()
_global_pools: tuple[int, int] | None = None


def loaded_openmp_runtimes() -> list[str]:
    """Paths of OpenMP runtimes already mapped into this process."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return []
    return sorted(p for p in paths if any(name in os.path.basename(p) for name in _OPENMP_LIBRARIES))


def apply_thread_environment(env: Mapping[str, str]) -> None:
    """Export `env` (from `ProcessorConfig.env_overrides()`); warn when an OpenMP runtime
    was loaded before, since it has read its settings already."""
    if not env:
        return
    os.environ.update(env)
    late = loaded_openmp_runtimes()
    if late:
        log.warning(
            "%s set after OpenMP runtime(s) %s were loaded; they keep the values they started with",
            ", ".join(f"{k}={v}" for k, v in env.items()),
            ", ".join(late),
        )


def global_thread_pools() -> tuple[int, int] | None:
    """(intra, inter) of ONNX Runtime's global pools if this process created them."""
    return _global_pools


def use_global_thread_pools(intra: int, inter: int, *, python_binding: bool = True) -> None:
    """Create ONNX Runtime's process-wide pools (0 = ONNX Runtime's default size) unless
    they exist; if an earlier model created them with other sizes, those stay.
    python_binding false: the C API's env made them (recserve.runtime.native_runner); only
    record them, so the Python binding starts no pool threads that nothing would use."""
    global _global_pools
    with _lock:
        if _global_pools is None:
            try:
                if python_binding:
                    ort.set_global_thread_pool_sizes(intra, inter)
            except Exception as exc:  # onnxruntime raises its own exception types
                raise ConfigError(
                    f"use_per_session_threads false needs ONNX Runtime's global thread pools, which "
                    f"cannot be created in this process: {exc}",
                    field="use_per_session_threads",
                ) from exc
            _global_pools = (intra, inter)
        elif _global_pools != (intra, inter):
            log.warning(
                "ONNX Runtime's global thread pools exist with intra=%d inter=%d (set by the first model); "
                "this model asked for intra=%d inter=%d and shares the existing pools",
                *_global_pools, intra, inter,
            )
