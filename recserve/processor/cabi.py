"""The Python side of libserving_processor.so (`native/processor_shim.c`, DESIGN §2).

The shim calls these functions with the GIL held. Each returns plain values — a status and
bytes — and turns every exception into a status and message, so the C side only copies
bytes and a host never sees a Python error. Thread-safe: the functions keep no state and
every `Processor` is thread-safe.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from recserve.errors import InternalError, RecserveError
from recserve.processor.native_route import route_process_address
from recserve.processor.processor import Processor

__all__ = ["close", "include_dir", "library_path", "model_info", "native_route", "open_processor", "process", "process_batch"]

LIBRARY_NAME = "libserving_processor.so"
# Threads batch_process serves one call's requests on (with dynamic batching on); more
# requests than this queue, and still merge as the batcher collects them.
BATCH_WORKERS = 64

log = logging.getLogger("recserve.cabi")


def library_path() -> str:
    """Absolute path of the built libserving_processor.so (what `recserve lib-path` prints)."""
    path = Path(__file__).resolve().parent.parent / LIBRARY_NAME
    if not path.is_file():
        raise InternalError(
            f"{LIBRARY_NAME} was not built: expected it at {path}; build it with `make native` "
            "(or `python setup.py build_ext --inplace`) in the recserve checkout, or reinstall recserve"
        )
    return str(path)


def include_dir() -> str:
    """The directory holding processor.h, DeepRec's C ABI as recserve ships it (what
    `recserve include-path` prints): for hosts that link instead of dlopen."""
    return str(Path(__file__).resolve().parent.parent / "include")


def _failure(exc: Exception) -> tuple[int, str]:
    if isinstance(exc, RecserveError):
        return exc.status, exc.message
    log.exception("C ABI call failed")
    return 500, f"internal error: {type(exc).__name__}: {exc}"


def open_processor(model_entry: bytes, model_config: bytes) -> tuple[Processor | None, str]:
    """`initialize`: (processor, "") or (None, the reason it could not be created)."""
    name = model_entry.decode("utf-8", "replace") or "default"
    try:
        return Processor(model_config, model_name=name), ""
    except Exception as exc:  # noqa: BLE001 - the host gets state -1 and the reason, never a Python error
        return None, _failure(exc)[1]


def process(processor: Processor, data: bytes) -> tuple[int, bytes]:
    # The shim tried the native route already (without the GIL): this is the Python route.
    return processor.process_python(data)


def native_route(processor: Processor) -> tuple[int, int, bool]:
    """(address of rs_route_process, address of the processor's route slot, whether
    batch_process may serve natively); (0, 0, False) when there is no native route. Requests
    with dynamic batching on still merge: the route's dense run goes through the batcher."""
    slot = processor.route_slot
    address = route_process_address()
    if not slot.enabled or not address:
        return 0, 0, False
    return address, slot.address or 0, processor.config.max_batch_size == 0


def process_batch(processor: Processor, requests: list[bytes]) -> list[tuple[int, bytes]]:
    """`batch_process`: every request gets its own status and reply. With dynamic batching
    on (max_batch_size > 0) they are served concurrently, so the batcher merges them into
    shared runs as it merges concurrent callers; one by one, each would wait out
    batch_timeout_micros alone. Otherwise they run in order on the calling thread."""
    if processor.config.max_batch_size > 0 and len(requests) > 1:
        return list(_batch_workers().map(processor.process, requests))
    return [processor.process_python(data) for data in requests]


_workers: ThreadPoolExecutor | None = None
_workers_lock = threading.Lock()


def _batch_workers() -> ThreadPoolExecutor:
    global _workers
    with _workers_lock:
        if _workers is None:
            _workers = ThreadPoolExecutor(BATCH_WORKERS, thread_name_prefix="recserve-batch-process")
        return _workers


def model_info(processor: Processor) -> tuple[int, bytes]:
    """`get_serving_model_info`: (200, ServingModelInfo bytes) or (status, message)."""
    try:
        return 200, processor.model_info_bytes()
    except Exception as exc:  # noqa: BLE001 - the host gets a status and message
        status, message = _failure(exc)
        return status, message.encode()


def load_version(processor: Processor, version: bytes | None) -> tuple[int, bytes]:
    """`load_version`: pin a full version (None or b"" unpins); (200, model info JSON) or (status, message)."""
    try:
        info = processor.load_version(version.decode("utf-8") if version else None)
        return 200, json.dumps(info).encode()
    except Exception as exc:  # noqa: BLE001 - the host gets a status and message
        status, message = _failure(exc)
        return status, message.encode()


def close(processor: Processor) -> None:
    """`destroy`: stop serving; a failure is logged, never raised into the host."""
    try:
        processor.close()
    except Exception:
        log.exception("closing model %r failed", processor.model_name)
