"""A worker process's side of the pool: its line to the leader and its processors.

A worker serves what the leader loaded: for each model, the leader sends a
`ServableDescriptor` of every version it swaps in; the worker builds its own sessions over
the leader's shared tables, warms them up and swaps them in (`FollowerProcessor`), then
tells the leader, and tells it again when the old version's last request has finished so
the leader may free that version's tables. Deltas need no message: the leader writes the
shared rows in place. Admin calls (pin, warmup recording) go to the leader, which acts on
the whole pool.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import threading
import time
from multiprocessing.connection import Client
from typing import TYPE_CHECKING, Any

from recserve.config import ProcessorConfig
from recserve.errors import ModelNotReadyError, RecserveError
from recserve.model_store.load_progress import LoadProgress
from recserve.processor.manager import ServableManager
from recserve.processor.native_predict import NativePredict
from recserve.processor.processor import Processor
from recserve.processor.servable import Servable
from recserve.server.workers.channel import Channel
from recserve.server.workers.descriptor import ServableDescriptor
from recserve.warmup import Warmup

if TYPE_CHECKING:
    from recserve.server.registry import ModelRegistry

__all__ = ["FollowerProcessor", "PoolClient"]

log = logging.getLogger("recserve.server")


class PoolClient:
    """A worker's line to the leader. Thread-safe."""

    def __init__(self, address: str, authkey: bytes, index: int) -> None:
        self.index = index
        self._followers: dict[str, FollowerProcessor] = {}
        self._waiting: dict[str, tuple[int, ServableDescriptor]] = {}
        self._info: dict[str, dict[str, Any]] = {}
        self._pool_ready = False
        self._registry: ModelRegistry | None = None
        self._lock = threading.Lock()
        self._versions: queue.SimpleQueue[tuple[int, ServableDescriptor] | None] = queue.SimpleQueue()
        connection = Client(address, family="AF_UNIX", authkey=authkey)
        self.channel = Channel(connection, name=f"worker-{index}", on_message=self._on_message,
                               on_call=self._on_call, on_close=self._leader_gone)
        threading.Thread(target=self._adopt_versions, name="recserve-adopt", daemon=True).start()
        self.channel.start()
        self.channel.send("hello", index=index, pid=os.getpid())

    def attach(self, registry: ModelRegistry) -> None:
        self._registry = registry
        threading.Thread(target=self._report_readiness, name="recserve-readiness", daemon=True).start()

    # -- what the leader tells us ----------------------------------------------------------

    def _on_message(self, kind: str, fields: dict[str, Any]) -> None:
        if kind == "serve":
            self._versions.put((fields["token"], fields["descriptor"]))
        elif kind == "info":
            self._info = fields["models"]
            self._pool_ready = fields["pool_ready"]
            for name, follower in list(self._followers.items()):
                follower.note_delta_step(self._info.get(name, {}))
        elif kind == "invalidate":
            follower = self._followers.get(fields["model"])
            if follower is not None:
                follower.invalidate(fields["version"], fields["tables"])
        elif kind == "record_start" and self._registry is not None:
            self._registry.get(fields["model"]).begin_local_recording(fields["limit"])

    def _on_call(self, kind: str, fields: dict[str, Any]) -> Any:
        if kind == "record_collect" and self._registry is not None:
            return self._registry.get(fields["model"]).collect_local_recording()
        raise RecserveError(f"worker {self.index}: unknown call {kind!r}")

    def _leader_gone(self) -> None:
        log.error("worker %d: the leader has gone away; stopping", self.index)
        os.kill(os.getpid(), signal.SIGTERM)

    def _adopt_versions(self) -> None:
        # One at a time, in the order the leader sent them: a newer version never loses
        # to an older one still building.
        while True:
            item = self._versions.get()
            if item is None:
                return
            token, descriptor = item
            with self._lock:
                follower = self._followers.get(descriptor.model)
                if follower is None:
                    self._waiting[descriptor.model] = (token, descriptor)
                    continue
            follower.adopt(token, descriptor)

    def register(self, follower: FollowerProcessor) -> None:
        with self._lock:
            self._followers[follower.model_name] = follower
            waiting = self._waiting.pop(follower.model_name, None)
        if waiting is not None:
            self._versions.put(waiting)

    def _report_readiness(self) -> None:
        last = None
        while not self.channel.closed:
            registry = self._registry
            ready = registry is not None and registry.locally_ready and registry.listening.is_set()
            if ready != last:
                try:
                    self.channel.send("ready", ready=ready)
                except RecserveError:
                    return
                last = ready
            time.sleep(0.2)

    # -- what we ask of the leader ---------------------------------------------------------

    @property
    def closing(self) -> bool:
        registry = self._registry
        return self.channel.closed or (registry is not None and registry.draining)

    @property
    def ready(self) -> bool:
        """Every worker of the pool serves every model (the leader's word)."""
        return self._pool_ready

    def info(self, model: str) -> dict[str, Any]:
        return dict(self._info.get(model, {}))

    def serving(self, token: int, model: str, version: str) -> None:
        self.channel.send("serving", token=token, model=model, version=version)

    def released(self, token: int) -> None:
        try:
            self.channel.send("released", token=token)
        except RecserveError:
            pass  # the leader is gone: nothing left to free

    def pin(self, model: str, version: str | None) -> dict[str, Any]:
        return dict(self.channel.call("pin", timeout=None, model=model, version=version))

    def start_recording(self, model: str, limit: int) -> None:
        self.channel.call("record_start", model=model, limit=limit)

    def save_recording(self, model: str, path: str) -> dict[str, Any]:
        return dict(self.channel.call("record_save", model=model, path=path))


class FollowerProcessor(Processor):
    """A `Processor` whose versions come from the leader (same serving methods; no watcher,
    no updater: the leader does that for the pool)."""

    def __init__(self, pool: PoolClient, model_name: str, config: ProcessorConfig,
                 progress: LoadProgress | None = None) -> None:
        self.config = config
        self.model_name = model_name
        self.progress = progress or LoadProgress(model_name)
        self._pool = pool
        self._manager: ServableManager[Servable] = ServableManager(model_name)
        self._native_predict = NativePredict(self._manager)
        self._warmup = Warmup.from_config(config)
        self._first = threading.Event()
        self._closed = False
        self._state_lock = threading.Lock()
        self._updater = None
        self._model_copy = self._placement_dir = None
        pool.register(self)
        while not self._first.wait(0.5):
            if pool.closing:
                raise ModelNotReadyError(f"model {model_name!r}: this worker is stopping")

    def adopt(self, token: int, descriptor: ServableDescriptor) -> None:
        """Serve the leader's version from now on (built, warmed up, then swapped in)."""
        try:
            servable = descriptor.build(self.config)
            self._warmup.run(servable)
        except Exception as exc:  # noqa: BLE001  (any failure: keep serving the version we have)
            log.error("worker %d: model %r: version %s failed to load here (%s); keeping the one serving",
                      self._pool.index, self.model_name, descriptor.version, exc)
            self._pool.released(token)
            return
        servable.on_close = lambda: self._pool.released(token)
        self._manager.swap(servable)
        self._first.set()
        self._pool.serving(token, self.model_name, descriptor.version)

    def note_delta_step(self, info: dict[str, Any]) -> None:
        """The leader applied deltas to the shared rows: answers name the newest from now on."""
        servable = self._manager.current
        if servable is not None and info.get("version") == servable.version:
            servable.set_delta_step(int(info.get("delta_step") or 0))

    def invalidate(self, version: str, tables: dict[str, Any]) -> None:
        """Drop keys a delta changed in Redis from this worker's caches of `version`."""
        with self._manager.acquire() as servable:
            if servable.version != version or servable.redis is None:
                return
            for name, keys in tables.items():
                table = servable.redis.tables.get(name)
                if table is not None:
                    table.invalidation.delete(keys)

    def load_version(self, name: str | None) -> dict[str, Any]:
        return self._pool.pin(self.model_name, name)

    def _describe(self, servable: Servable | None) -> dict[str, Any]:
        info = self._pool.info(self.model_name) or super()._describe(servable)
        info.update({
            "ready": servable is not None,
            "version": servable.version if servable else None,
            "global_step": servable.global_step if servable else None,
            "signature_name": servable.default_signature if servable else None,
            "tables": {name: {"rows": len(t)} for name, t in servable.tables.items()} if servable else {},
            "worker": self._pool.index,
            # This worker's own native route (the leader's counts are the leader's requests).
            "native_route": {"enabled": bool(servable is not None and servable.native is not None),
                             **self._manager.route_slot.counters()},
        })
        return info

    def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._manager.shutdown()
