"""`Processor`: one served model behind DeepRec's processor semantics (DESIGN §2, §3, §6).

`process(bytes) -> (status, bytes)` is the C ABI's path and never raises; `predict` is the
Python path and raises `recserve.errors.*`. Thread-safe: any number of threads may call
`process`/`predict` while versions are swapped underneath (each request leases one).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.config import ProcessorConfig, parse_config
from recserve.errors import ConfigError, InternalError, RecserveError
from recserve.model_store.backends import copy_to_local, storage_for
from recserve.model_store.backoff import Backoff
from recserve.model_store.checkpoint import Checkpoint
from recserve.model_store.load_progress import LoadProgress
from recserve.model_store.memory_budget import available_memory
from recserve.model_store.model_dir import graph_checkpoint, load_model_dir
from recserve.model_store.storage import LocalStorage
from recserve.model_store.updater import ModelUpdater
from recserve.model_store.watcher import VersionWatcher
from recserve.processor.manager import ServableManager
from recserve.processor.native_predict import NativePredict
from recserve.processor.native_route import RouteSlot
from recserve.processor.servable import Servable
from recserve.processor.trace import RequestTrace
from recserve.runtime.placement import PlacedModel, place_embeddings
from recserve.runtime.threads import apply_thread_environment
from recserve.warmup import Warmup
from recserve.wire import codec

if TYPE_CHECKING:
    from recserve.wire._codec_native import ParsedRequest
    from recserve.wire.codec import DecodedRequest

__all__ = ["Processor"]

log = logging.getLogger("recserve.processor")


class Processor:
    def __init__(
        self, config: str | bytes | Mapping[str, Any] | ProcessorConfig, *, model_name: str = "default",
        progress: LoadProgress | None = None,
        on_swap: Callable[[Processor, Servable | None], None] | None = None,
    ) -> None:
        self.config = config if isinstance(config, ProcessorConfig) else parse_config(config)
        # Given by a caller that reports a first load while this constructor runs (the server).
        self.progress = progress or LoadProgress(model_name)
        # OpenMP runtimes read these when they load, so they go first (DeepRec's omp fields).
        apply_thread_environment(self.config.env_overrides())
        self.model_name = model_name
        # on_swap: the leader of worker processes hands each new version to its workers.
        self._manager: ServableManager[Servable] = ServableManager(
            model_name, None if on_swap is None else lambda servable: on_swap(self, servable))
        self._native_predict = NativePredict(self._manager)
        self._storage = storage_for(self.config)
        self._state_lock = threading.Lock()
        self._closed = False
        self._model_copy: str | None = None
        self._placement_dir: str | None = None
        self._updater: ModelUpdater | None = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    # -- loading -------------------------------------------------------------------------

    def _start(self) -> None:
        model_dir = self.config.savedmodel_dir
        if self._storage.local_path(model_dir) is None:
            # ONNX Runtime opens model files by local path: copy a remote model dir once.
            self._model_copy = model_dir = copy_to_local(self._storage, model_dir)
            self._model = load_model_dir(LocalStorage(), model_dir, self.config.signature_name or None)
        else:
            self._model = load_model_dir(self._storage, model_dir, self.config.signature_name or None)
        self._warmup = Warmup.from_config(self.config)
        self._placed: PlacedModel | None = None
        if self.config.enable_device_placement_optimization and not self._model.spec.embeddings:
            # Once per model dir: every version's servable shares the rewritten graph.
            self._placement_dir = tempfile.mkdtemp(prefix="recserve-placed-")
            self._placed = place_embeddings(self._model.onnx_path, self._placement_dir)
            for table, why in self._placed.kept.items():
                log.warning("model %r: table %r stays in the graph: %s", self.model_name, table, why)
        if self.config.checkpoint_dir is None:
            # DESIGN §4: without checkpoint_dir the graph's own values serve; nothing updates.
            servable = self._build(graph_checkpoint(self._model, self.config.savedmodel_dir))
            self._warmup.run(servable)
            self._manager.swap(servable)
            return
        interval = self.config.model_update_interval_seconds
        full_update_mode = self.config.full_update_mode
        if full_update_mode == "in_place" and self._placed is not None:
            log.warning("model %r: full_update_mode in_place: a plain ONNX model under device placement "
                        "takes its rows from the graph and the version; its full versions are swapped in",
                        self.model_name)
            full_update_mode = "swap"
        self._updater = ModelUpdater(
            VersionWatcher(self._storage, self.config.checkpoint_dir, backoff=Backoff(interval, max(60.0, interval)),
                           progress=self.progress),
            self._manager,
            self._build,
            interval=interval,
            warmup=self._warmup.run,
            pinned=self.config.pinned_version,
            model_name=self.model_name,
            full_update_mode=full_update_mode,
            load_tables=not self.config.uses_redis,
            # Tables in Redis or on an SSD tier do not build into this process's memory.
            available_memory=available_memory if not self.config.uses_redis and self.config.ev_storage_type != 12
            else None,
        )
        minutes = self.config.init_timeout_minutes
        self._updater.load_initial(None if minutes == -1 else minutes * 60.0)
        self._updater.start()

    def _build(self, checkpoint: Checkpoint, tables: Mapping[str, Any] | None = None) -> Servable:
        return Servable.load(self._model, checkpoint, self.config, placed=self._placed, model_name=self.model_name,
                             progress=self.progress.advance, tables=tables)

    @property
    def model_dir(self) -> str:
        """The local directory the graph is read from (savedmodel_dir, its local copy, or a
        SavedModel's conversion)."""
        if self._model.graph_bundle is not None or self._model.root not in ("", self.config.savedmodel_dir):
            return self._model.root
        return self._model_copy or self.config.savedmodel_dir

    @property
    def route_slot(self) -> RouteSlot:
        """Where the native route finds this model's current version (the C ABI's process())."""
        return self._manager.route_slot

    @property
    def placed(self) -> PlacedModel | None:
        return self._placed

    def hold(self) -> tuple[Servable, Any]:
        """The current servable and a lease on it that outlives this call: release it with
        `lease.__exit__(None, None, None)` (the leader holds one per worker process)."""
        lease = self._manager.acquire()
        return lease.__enter__(), lease

    def load_version(self, name: str | None) -> dict[str, Any]:
        """Serve full version `name` (a directory under checkpoint_dir) and its deltas from now
        on, pinned: rollback. None unpins: the newest version serves again. Returns
        `model_info()`; raises ModelLoadError / StorageError (then nothing changed)."""
        if self._updater is None:
            raise ConfigError("load_version needs checkpoint_dir: without it nothing is versioned", field="checkpoint_dir")
        self._updater.load_version(name)
        return self.model_info()

    # -- serving -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._manager.current is not None

    def predict(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        signature_name: str | None = None,
        trace: RequestTrace | None = None,
    ) -> dict[str, np.ndarray]:
        """Outputs keyed by alias (or by the name used in `outputs`); raises RecserveError."""
        # The native route first (native_predict): the same answer without the Python route,
        # or None for anything it does not serve (errors included).
        try:
            answer = self._native_predict.predict(inputs, outputs, signature_name, trace)
        except Exception as exc:
            raise self._bug("predict", exc) from exc
        if answer is not None:
            return answer
        with self._manager.acquire() as servable:
            try:
                return servable.predict(inputs, outputs, signature_name=signature_name, trace=trace)
            except RecserveError:
                raise
            except Exception as exc:
                raise self._bug("predict", exc) from exc

    def serve(self, parsed: ParsedRequest | None, decode: Callable[[], DecodedRequest],
              trace: RequestTrace) -> dict[str, np.ndarray]:
        """Outputs of a request another protocol parsed (Servable.serve); raises RecserveError."""
        start = time.perf_counter_ns()
        with self._manager.acquire() as servable:
            try:
                return servable.serve(parsed, decode, trace, start)
            except RecserveError:
                raise
            except Exception as exc:
                raise self._bug("serve", exc) from exc

    def _bug(self, what: str, exc: Exception) -> InternalError:
        """An exception that is not a RecserveError escaped `what`: a bug. Logged here with
        its traceback (the caller's `except` block is active), returned as the 500 callers see."""
        log.exception("model %r: %s failed", self.model_name, what)
        return InternalError(f"internal error: {type(exc).__name__}: {exc}")

    def process(self, data: bytes, *, trace: RequestTrace | None = None) -> tuple[int, bytes]:
        """(200, PredictResponse bytes) or (status, UTF-8 message). Never raises."""
        # The native route first (DESIGN §10): bytes to bytes in C, the GIL released; a miss,
        # an error or a Python-only feature (an ONNX Runtime profile) comes back as None.
        if data:
            response = self._manager.route_slot.process(data, trace)
            if response is not None:
                return 200, response
        return self.process_python(data, trace=trace)

    def process_tfs(self, data: bytes, trace: RequestTrace) -> bytes | None:
        """A tensorflow.serving.PredictRequest on the native route: its PredictResponse's
        outputs (the caller checks the version `trace` names and appends the model_spec), or
        None (the reason counted): serve it with `serve`. Never raises."""
        return self._manager.route_slot.process_tfs(data, trace)

    def process_python(self, data: bytes, *, trace: RequestTrace | None = None) -> tuple[int, bytes]:
        """`process` on the Python route only: the spec the native route is tested against,
        and where every request the native route does not serve goes."""
        trace = trace or RequestTrace()
        try:
            if not data:
                return 200, json.dumps(self.signature_info()).encode()
            with self._manager.acquire() as servable:
                return 200, servable.process(data, trace)
        except RecserveError as exc:
            return exc.status, exc.message.encode()
        except Exception as exc:  # noqa: BLE001  (logged by _bug; the C ABI's callers must never see one)
            error = self._bug("process", exc)
            return error.status, error.message.encode()

    def process_many(self, payloads: Sequence[bytes], traces: Sequence[RequestTrace],
                     max_rows: int) -> list[tuple[int, bytes]]:
        """What `process` answers each payload, the requests that agree in layout merged into
        ONNX Runtime runs of up to `max_rows` rows: on the native route first (one lease of
        the published version, RouteSlot.process_many), the requests it declines on one
        leased version in Python (recserve.processor.merged_runs); a swap between the two
        may answer them from different versions, as two `process` calls would be. Never
        raises; one bad request fails only itself."""
        answers: list[tuple[int, bytes]] = [(0, b"")] * len(payloads)
        merge = [i for i, data in enumerate(payloads) if data]
        if len(merge) < len(payloads):
            for i, data in enumerate(payloads):
                if not data:
                    answers[i] = self.process(data, trace=traces[i])
            native = self._native_many([payloads[i] for i in merge], [traces[i] for i in merge], max_rows)
        else:   # the usual call: every payload a request
            native = self._native_many(payloads, traces, max_rows)
        left = []
        for i, response in zip(merge, native):
            if response is None:
                left.append(i)
            else:
                answers[i] = (200, response)
        merge = left
        if not merge:
            return answers
        try:
            with self._manager.acquire() as servable:
                merged = servable.process_many([payloads[i] for i in merge], [traces[i] for i in merge], max_rows)
        except RecserveError as exc:
            merged = [exc] * len(merge)
        except Exception as exc:  # noqa: BLE001  (logged by _bug; the C ABI's callers must never see one)
            merged = [self._bug("process", exc)] * len(merge)
        for i, answer in zip(merge, merged):
            answers[i] = (200, answer) if isinstance(answer, bytes) else (answer.status, answer.message.encode())
        return answers

    def _native_many(self, payloads: Sequence[bytes], traces: Sequence[RequestTrace],
                     max_rows: int) -> Sequence[bytes | None]:
        """The native route's merged answers (rs_route_process_many: the same answers merged
        in C, the GIL released), None for each request it leaves to the Python path; all
        None, logged, if the call itself failed (a bug)."""
        if not payloads:
            return []
        try:
            return self._manager.route_slot.process_many(payloads, traces, max_rows)
        except Exception as exc:  # noqa: BLE001  (logged by _bug; the Python path answers them)
            self._bug("process_many's native route", exc)
            return [None] * len(payloads)

    # -- introspection -------------------------------------------------------------------

    def signature_info(self, signature_name: str | None = None) -> dict[str, Any]:
        with self._manager.acquire() as servable:
            return servable.signature(signature_name).describe()

    def signature_description(self, signature_name: str | None = None) -> Mapping[str, Any]:
        """`signature_info`, shared and made once per version's signature: read it, never
        modify it (request paths read it on every request)."""
        with self._manager.acquire() as servable:
            return servable.signature(signature_name).description

    def signature_infos(self) -> dict[str, dict[str, Any]]:
        """Every signature's `signature_info`, by name, the default signature first."""
        with self._manager.acquire() as servable:
            default = servable.default_signature
            names = [default, *sorted(n for n in servable.signatures if n != default)]
            return {name: servable.signatures[name].describe() for name in names}

    def model_info(self) -> dict[str, Any]:
        # Leased: a swap may retire this servable meanwhile, and its tables are freed
        # once its last lease ends (reading their sizes then read freed memory).
        with self._manager.peek() as servable:
            return self._describe(servable)

    def _describe(self, servable: Servable | None) -> dict[str, Any]:
        updates = self._updater.status() if self._updater else {}
        changed = updates.get("update_time") or (servable.loaded_at if servable else None)
        return {
            "model_name": self.model_name,
            "model_path": self.config.checkpoint_dir,
            "savedmodel_dir": self.config.savedmodel_dir,
            "ready": servable is not None,
            "version": servable.version if servable else None,
            "global_step": servable.global_step if servable else None,
            # The servable's own: set as each delta lands, before the updater's bookkeeping.
            "delta_step": servable.delta_step if servable else updates.get("delta_step", 0),
            # When the served parameters last changed: a full swap or a delta.
            "update_time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(changed)) if changed else None,
            "signature_name": servable.default_signature if servable else None,
            "pinned_version": updates.get("pinned_version"),
            "full_updates": updates.get("full_updates", 0),
            "delta_updates": updates.get("delta_updates", 0),
            "update_failures": updates.get("failures", {}),
            "last_error": updates.get("last_error"),
            "load": self.progress.snapshot(),
            "tables": {name: {"rows": len(t)} for name, t in servable.tables.items()} if servable else {},
            # Requests served by the native route, and those that took the Python one by reason.
            "native_route": {"enabled": bool(servable is not None and servable.native is not None),
                             **self._manager.route_slot.counters()},
        }

    def model_info_bytes(self) -> bytes:
        return codec.encode_model_info(self.model_info())

    def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        if self._updater is not None:
            self._updater.stop()
        self._manager.shutdown()
        for scratch in (self._model_copy, self._placement_dir):
            if scratch is not None:
                shutil.rmtree(scratch, ignore_errors=True)
