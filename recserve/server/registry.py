"""The models one server serves: a `Processor` per configured model, loaded off the
request path and leased by requests.

Each model's processor sits in a `ServableManager`, so closing it at shutdown never
pulls it from under a running request: it closes when its last lease ends. Version
changes (updates, admin pins) happen inside the processor. Thread-safe.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Literal, Protocol

from recserve.config import ProcessorConfig
from recserve.errors import ModelNotReadyError, RecserveError, RequestError
from recserve.model_store.load_progress import LoadProgress
from recserve.processor.manager import ServableManager
from recserve.processor.processor import Processor
from recserve.server.admission import Admission
from recserve.server.errors import ConflictError, UnknownModelError
from recserve.server.timeline import TimelineSelector
from recserve.warmup import WarmupRecorder

__all__ = ["ModelEntry", "ModelRegistry"]

log = logging.getLogger("recserve.server")

LoadState = Literal["loading", "loaded", "failed"]


class PoolLink(Protocol):
    """A worker process's line to the leader (recserve.server.workers): what acts on the pool."""

    @property
    def ready(self) -> bool: ...

    def start_recording(self, model: str, limit: int) -> None: ...

    def save_recording(self, model: str, path: str) -> dict[str, Any]: ...


ProcessorFactory = Callable[["ModelEntry"], Processor]


def _own_processor(entry: ModelEntry) -> Processor:
    return Processor(entry.config, model_name=entry.name, progress=entry.progress)


class ModelEntry:
    """One configured model. Thread-safe; `_swap_lock` serializes load and close."""

    def __init__(self, name: str, config: ProcessorConfig, make_processor: ProcessorFactory = _own_processor,
                 pool: PoolLink | None = None) -> None:
        self.name = name
        self.config = config
        self._make_processor = make_processor
        self._pool = pool
        self.state: LoadState = "loading"
        self.last_error: str | None = None
        self.timeline = TimelineSelector.from_config(config)
        self.load_counts = {"ok": 0, "error": 0}
        self._manager: ServableManager[Processor] = ServableManager(name)
        self._swap_lock = threading.Lock()
        self._recorder: WarmupRecorder | None = None
        self._on_serving: list[Callable[[Processor], None]] = []
        self._on_recording: list[Callable[[], None]] = []
        self.admission = Admission(name, config.max_queued_requests, config.max_queue_ms / 1000)
        # The load of a version, first or later, as it goes (the processor reports into it).
        self.progress = LoadProgress(name)

    # -- recording a warmup file from live traffic (admin routes) ---------------------------

    def start_recording(self, limit: int) -> None:
        """Keep a uniform sample of up to `limit` PredictRequests answered 200 from now on
        (a sample already being kept is dropped); in a worker process, on every worker."""
        if self._pool is not None:
            self._pool.start_recording(self.name, limit)
        else:
            self.begin_local_recording(limit)

    def begin_local_recording(self, limit: int) -> None:
        self._set_recorder(WarmupRecorder(limit))

    def collect_local_recording(self) -> tuple[list[bytes], int] | None:
        """This process's sample and the requests it saw, recording stopped; None if not recording."""
        recorder = self._recorder
        self._set_recorder(None)
        return None if recorder is None else (recorder.requests(), recorder.seen)

    def _set_recorder(self, recorder: WarmupRecorder | None) -> None:
        self._recorder = recorder
        for listener in self._on_recording:
            listener()

    @property
    def recording(self) -> bool:
        """Whether this process keeps a sample of the requests answered (`record`)."""
        return self._recorder is not None

    def when_recording_changes(self, listener: Callable[[], None]) -> None:
        """`listener()` each time this process starts or stops recording."""
        self._on_recording.append(listener)

    def when_serving(self, listener: Callable[[Processor], None]) -> None:
        """`listener(processor)` once the model's processor serves: now if it does already."""
        with self._swap_lock:
            self._on_serving.append(listener)
            processor = self._manager.current
        if processor is not None:
            listener(processor)

    def record(self, payload: bytes) -> None:
        """A PredictRequest the model answered 200 (EAS HTTP and gRPC); kept while recording."""
        recorder = self._recorder
        if recorder is not None:
            recorder.record(payload)

    def save_recording(self, path: str) -> dict[str, Any]:
        """Write the sample as a warmup file at `path` and stop recording."""
        if self._pool is not None:
            return self._pool.save_recording(self.name, path)
        recorder = self._recorder
        if recorder is None:
            raise ConflictError(
                f"model {self.name!r} is not recording; POST /admin/models/{self.name}/warmup/record first")
        if not recorder.seen:
            raise ConflictError(f"model {self.name!r} has answered no PredictRequest since recording began")
        try:
            kept = recorder.write(path)
        except OSError as exc:
            raise RequestError(f"cannot write the warmup file {path!r}: {exc.strerror or exc}") from exc
        self._set_recorder(None)
        return {"path": path, "requests": kept, "seen": recorder.seen}

    @property
    def processor(self) -> Processor | None:
        """The processor answering new requests (no lease: for reporting only)."""
        return self._manager.current

    @property
    def ready(self) -> bool:
        processor = self._manager.current
        return processor is not None and processor.ready

    def lease(self) -> AbstractContextManager[Processor]:
        """`with entry.lease() as processor:` the serving processor, held for the block
        (the manager's lease itself, not a generator around it: this is on every request)."""
        if self._manager.current is None:
            if self.state == "failed":
                raise ModelNotReadyError(f"model {self.name!r} is not loaded: {self.last_error}")
            raise ModelNotReadyError(f"model {self.name!r} is still loading")
        return self._manager.acquire()

    def load(self) -> Processor:
        """Build the model's processor and serve it; raises RecserveError on failure."""
        with self._swap_lock:
            try:
                processor = self._make_processor(self)
            except RecserveError as exc:
                self.load_counts["error"] += 1
                self.last_error = exc.message
                self.state = "failed"
                raise
            self.load_counts["ok"] += 1
            self.state = "loaded"
            self.last_error = None
            self._manager.swap(processor)
            for listener in self._on_serving:
                listener(processor)
            return processor

    def pin(self, version: str | None) -> dict[str, Any]:
        """Serve full version `version` (a directory under checkpoint_dir) and its deltas
        from now on; None: the newest again. Returns the model info; on failure the
        serving version is unchanged and the error is raised."""
        with self.lease() as processor:
            return processor.load_version(version)

    def close(self) -> None:
        with self._swap_lock:
            self._manager.swap(None)


class ModelRegistry:
    """Every model of the config, by name, in config order. Thread-safe."""

    def __init__(self, models: Sequence[tuple[str, ProcessorConfig]], *,
                 make_processor: ProcessorFactory = _own_processor, pool: PoolLink | None = None) -> None:
        self.entries = {name: ModelEntry(name, config, make_processor, pool) for name, config in models}
        self._pool = pool
        # Set by the server once its listeners accept connections (a worker of a pool reports
        # itself ready to the leader only then).
        self.listening = threading.Event()
        self._closing = threading.Event()
        self._loaders: list[threading.Thread] = []

    def names(self) -> list[str]:
        return list(self.entries)

    def get(self, name: str) -> ModelEntry:
        entry = self.entries.get(name)
        if entry is None:
            raise UnknownModelError(f"unknown model {name!r}; this server serves {self.names()}")
        return entry

    def for_service(self, service: str) -> ModelEntry:
        """The model an EAS ``/api/predict/{service}`` call means: the model of that name,
        else the only model (EAS service names are the deployment's, not the model's)."""
        entry = self.entries.get(service)
        if entry is not None:
            return entry
        if len(self.entries) == 1:
            return next(iter(self.entries.values()))
        raise UnknownModelError(
            f"service {service!r} names no model; this server serves {self.names()}: "
            "call /api/predict/{service}/{model}"
        )

    @property
    def ready(self) -> bool:
        """Every model loaded, not draining, and in a worker process: the whole pool ready."""
        return self.locally_ready and (self._pool is None or self._pool.ready)

    @property
    def locally_ready(self) -> bool:
        return not self._closing.is_set() and all(e.ready for e in self.entries.values())

    def start(self) -> None:
        """Load every model on its own thread; a model that fails is retried every
        model_update_interval_seconds until it loads or the registry closes."""
        for entry in self.entries.values():
            thread = threading.Thread(target=self._load_until_done, args=(entry,),
                                      name=f"recserve-load-{entry.name}", daemon=True)
            thread.start()
            self._loaders.append(thread)

    def _load_until_done(self, entry: ModelEntry) -> None:
        while not self._closing.is_set():
            try:
                entry.load()
                log.info("model %r loaded", entry.name)
                # What the imports and the load made lives as long as the process: kept out of
                # the collector's full passes, which visited it all (~136k objects, 90-150 ms
                # with the GIL held, measured with the demo model) whenever enough requests'
                # objects outlived two young collections, as merged requests do, and stalled
                # every request in flight (p99 73 ms against p90 11 ms).
                gc.freeze()
                return
            except RecserveError as exc:
                log.error("model %r failed to load (retrying in %.0f s): %s",
                          entry.name, entry.config.model_update_interval_seconds, exc.message)
            except Exception:  # a bug must not kill the loader silently
                log.exception("model %r failed to load", entry.name)
                entry.state = "failed"
                entry.last_error = "internal error while loading; see the server log"
            self._closing.wait(entry.config.model_update_interval_seconds)

    def start_draining(self) -> None:
        """Shutdown began: report not ready from now on."""
        self._closing.set()

    @property
    def draining(self) -> bool:
        return self._closing.is_set()

    def wait_draining(self, timeout: float) -> bool:
        """Block until shutdown begins or `timeout` passes; True once draining."""
        return self._closing.wait(timeout)

    def close(self) -> None:
        self._closing.set()
        for thread in self._loaders:
            thread.join(timeout=5.0)  # a load in progress finishes on its own (daemon)
        for entry in self.entries.values():
            entry.close()
