"""The leader of `recserve serve --workers N`: loads and updates every model once, in the
shared arena, and keeps N worker processes serving it (DESIGN §9).

    leader ──fork──> zygote ──fork──> worker 0 .. worker N-1   (HTTP + gRPC, SO_REUSEPORT)
      │  Unix socket: versions, leases, info, admin calls   │
      └──────────────────────────────────────────────────────┘

Each version the leader swaps in is offered to every worker with a lease on it (the leader's
ServableManager counts it like a request): the leader frees a version's tables only after
every worker has said it let go of it, or died. The leader answers no requests itself.
Workers that exit are restarted with backoff; SIGTERM stops the workers (each drains its
requests), then the models, then the leader, which exits 0.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Listener
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter

from recserve.embedding import shared_memory
from recserve.errors import RecserveError
from recserve.processor.processor import Processor
from recserve.processor.servable import Servable
from recserve.server.errors import ConflictError
from recserve.server.registry import ModelRegistry
from recserve.server.settings import GRACE_SECONDS
from recserve.server.workers.channel import Channel, ChannelClosed
from recserve.server.workers.descriptor import ServableDescriptor
from recserve.server.workers.zygote import Zygote
from recserve.warmup.warmup_file import write_warmup_file

__all__ = ["Leader"]

log = logging.getLogger("recserve.server")

_INFO_SECONDS = 0.25
_SERVING_WAIT_SECONDS = 120.0


@dataclass
class _Worker:
    index: int
    pid: int
    channel: Channel
    leases: dict[int, Any] = field(default_factory=dict)   # token -> lease on a leader servable
    offered: dict[str, int] = field(default_factory=dict)  # model -> token of the newest version sent
    serving: dict[str, int] = field(default_factory=dict)  # model -> token it serves
    ready: bool = False


class _Backoff:
    """Restart delays per worker slot: 0.5 s doubling to 10 s while a worker keeps dying
    within 10 s of its start (a crash loop); one that served longer restarts in 0.5 s."""

    def __init__(self) -> None:
        self.failures = 0
        self.started = 0.0

    def next_delay(self) -> float:
        if time.monotonic() - self.started > 10.0:
            self.failures = 0
        delay = min(10.0, 0.5 * 2 ** self.failures)
        self.failures += 1
        return delay


class Leader:
    def __init__(self, registry_factory: Callable[[Callable[[Processor, Servable | None], None]], ModelRegistry],
                 count: int, zygote: Zygote, address: str, authkey: bytes) -> None:
        self.count = count
        self._zygote = zygote
        self._lock = threading.RLock()
        self._workers: dict[int, _Worker] = {}      # by pid, once it said hello
        self._pids: dict[int, int] = {}             # slot index -> pid of its live process
        self._tokens = itertools.count(1)
        self._processors: dict[str, Processor] = {}  # by model, once it served a version
        self._stopping = threading.Event()
        self._listener = Listener(address, family="AF_UNIX", authkey=authkey)
        self.registry = registry_factory(self.publish)
        self._restarts = Counter("recserve_worker_restarts", "Worker processes restarted after they exited.",
                                 registry=CollectorRegistry())

    # -- versions to workers ---------------------------------------------------------------

    def publish(self, processor: Processor, servable: Servable | None) -> None:
        """on_swap of every model's processor: offer the new version to every worker."""
        if servable is None:
            return
        if servable.redis is not None:
            servable.on_delta = lambda delta: self._invalidate(processor.model_name, servable.version, delta)
        with self._lock:
            # Known from the first swap on, which happens inside the processor's constructor:
            # before the registry has the processor, a worker saying hello must get it too.
            self._processors[processor.model_name] = processor
            for worker in list(self._workers.values()):
                self._offer(worker, processor)

    def _invalidate(self, model: str, version: str, delta: Any) -> None:
        """Rows in Redis changed by a delta: every worker drops those keys from its cache (a
        worker is a replica that runs no updater of its own)."""
        changed = {name: np.concatenate([data.keys] + ([data.deleted] if data.deleted is not None else []))
                   for name, data in delta.tables.items()}
        for worker in self._live():
            try:
                worker.channel.send("invalidate", model=model, version=version, tables=changed)
            except ChannelClosed:
                pass

    def _offer(self, worker: _Worker, processor: Processor) -> None:
        try:
            servable, lease = processor.hold()
        except RecserveError:
            return  # nothing serving (yet)
        token = next(self._tokens)
        worker.offered[processor.model_name] = token
        worker.leases[token] = lease
        try:
            worker.channel.send("serve", token=token, descriptor=ServableDescriptor.of(processor, servable))
        except ChannelClosed:
            self._release(worker, token)

    def _release(self, worker: _Worker, token: int) -> None:
        lease = worker.leases.pop(token, None)
        if lease is not None:
            lease.__exit__(None, None, None)

    # -- the line to each worker -----------------------------------------------------------

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                connection = self._listener.accept()
            except OSError:
                return
            except Exception as exc:  # noqa: BLE001  (a bad handshake (wrong authkey) must not stop accepting)
                log.warning("pool: refused a connection: %s", exc)
                continue
            holder: dict[str, _Worker] = {}
            channel = Channel(connection, name="leader",
                              on_message=lambda kind, fields, h=holder: self._on_message(h, kind, fields),
                              on_call=lambda kind, fields: self._on_call(kind, fields),
                              on_close=lambda h=holder: self._gone(h))
            holder["channel"] = channel  # type: ignore[assignment]
            channel.start()

    def _on_message(self, holder: dict[str, Any], kind: str, fields: dict[str, Any]) -> None:
        if kind == "hello":
            worker = _Worker(fields["index"], fields["pid"], holder["channel"])
            with self._lock:
                holder["worker"] = worker
                self._workers[worker.pid] = worker
                for processor in self._processors.values():
                    self._offer(worker, processor)
            return
        worker = holder.get("worker")
        if worker is None:
            return
        with self._lock:
            if kind == "serving":
                worker.serving[fields["model"]] = fields["token"]
            elif kind == "released":
                self._release(worker, fields["token"])
            elif kind == "ready":
                worker.ready = fields["ready"]

    def _gone(self, holder: dict[str, Any]) -> None:
        worker = holder.get("worker")
        if worker is None:
            return
        with self._lock:
            self._workers.pop(worker.pid, None)
            for token in list(worker.leases):
                self._release(worker, token)

    def _on_call(self, kind: str, fields: dict[str, Any]) -> Any:
        entry = self.registry.get(fields["model"])
        if kind == "pin":
            info = entry.pin(fields["version"])
            self._wait_serving(entry.name)
            return info
        if kind == "record_start":
            for worker in self._live():
                worker.channel.send("record_start", model=entry.name, limit=fields["limit"])
            return None
        if kind == "record_save":
            return self._save_recording(entry.name, fields["path"])
        raise RecserveError(f"pool: unknown call {kind!r}")

    def _live(self) -> list[_Worker]:
        with self._lock:
            return list(self._workers.values())

    def _wait_serving(self, model: str) -> None:
        """Until every worker serves the model's newest version: a pin's answer then holds
        for whichever worker the next request reaches."""
        deadline = time.monotonic() + _SERVING_WAIT_SECONDS
        while time.monotonic() < deadline:
            if all(w.serving.get(model) == w.offered.get(model) for w in self._live()):
                return
            time.sleep(0.02)
        log.warning("pool: model %r: not every worker serves the pinned version after %.0f s",
                    model, _SERVING_WAIT_SECONDS)

    def _save_recording(self, model: str, path: str) -> dict[str, Any]:
        samples: list[tuple[list[bytes], int]] = []
        for worker in self._live():
            try:
                sample = worker.channel.call("record_collect", model=model)
            except ChannelClosed:
                continue
            if sample is not None:
                samples.append(sample)
        if not samples:
            raise ConflictError(
                f"model {model!r} is not recording; POST /admin/models/{model}/warmup/record first")
        seen = sum(s for _, s in samples)
        if not seen:
            raise ConflictError(f"model {model!r} has answered no PredictRequest since recording began")
        limit = max(len(kept) for kept, _ in samples)
        # A uniform sample of the pool's traffic from each worker's uniform sample: each kept
        # request stands for seen/kept of its worker's (weighted sampling without replacement).
        weighted = [(random.random() ** (len(kept) / s), payload)
                    for kept, s in samples if kept for payload in kept]
        chosen = [payload for _, payload in sorted(weighted, reverse=True)[:limit]]
        try:
            write_warmup_file(path, chosen)
        except OSError as exc:
            raise RecserveError(f"cannot write the warmup file {path!r}: {exc.strerror or exc}", status=400) from exc
        return {"path": path, "requests": len(chosen), "seen": seen}

    # -- info for the workers ---------------------------------------------------------------

    def _broadcast_info(self) -> None:
        last: Any = None
        last_sent = 0.0
        while not self._stopping.wait(_INFO_SECONDS):
            models = {}
            for name, entry in self.registry.entries.items():
                processor = entry.processor
                info = processor.model_info() if processor is not None else {
                    "model_name": name, "ready": False, "last_error": entry.last_error}
                info.pop("tables", None)
                models[name] = info
            live = self._live()
            pool_ready = len(live) == self.count and all(w.ready for w in live)
            message = {"models": models, "pool_ready": pool_ready}
            if message == last and time.monotonic() - last_sent < 5.0:
                continue
            for worker in live:
                try:
                    worker.channel.send("info", **message)
                except ChannelClosed:
                    pass
            last, last_sent = message, time.monotonic()

    # -- supervision ------------------------------------------------------------------------

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self._stopping.set())
        threading.Thread(target=self._accept, name="recserve-pool-accept", daemon=True).start()
        threading.Thread(target=self._broadcast_info, name="recserve-pool-info", daemon=True).start()
        self.registry.start()
        backoff = {index: _Backoff() for index in range(self.count)}
        due: dict[int, float] = {index: 0.0 for index in range(self.count)}
        restarted: set[int] = set()  # slots spawned once already: the next spawn replaces a worker
        code = 0
        while not self._stopping.is_set():
            now = time.monotonic()
            for index, when in list(due.items()):
                if when <= now:
                    del due[index]
                    backoff[index].started = now
                    self._zygote.spawn(index, replacement=index in restarted)
                    restarted.add(index)
            for kind, index, pid, status in self._zygote.events(0.2):
                if kind == "started":
                    self._pids[index] = pid
                elif kind == "exited":
                    self._pids.pop(index, None)
                    shared_memory.forget_reader(index)  # before its replacement reads
                    delay = backoff[index].next_delay()
                    log.error("worker %d (pid %d) exited (%s); restarting it in %.1f s",
                              index, pid, _describe_exit(status), delay)
                    self._restarts.inc()
                    due[index] = time.monotonic() + delay
                elif kind == "gone":
                    log.error("pool: the zygote died; stopping")
                    self._stopping.set()
                    code = 1
        self._shutdown()
        return code

    def _shutdown(self) -> None:
        log.info("shutting down: workers finish their requests in flight (up to %.0f s)", GRACE_SECONDS)
        self.registry.start_draining()
        for pid in list(self._pids.values()):
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + GRACE_SECONDS + 5.0
        while self._pids and time.monotonic() < deadline:
            for kind, index, pid, status in self._zygote.events(0.2):
                if kind == "exited":
                    self._pids.pop(index, None)
                    if os.waitstatus_to_exitcode(status) != 0:
                        log.warning("worker %d (pid %d) exited (%s)", index, pid, _describe_exit(status))
                elif kind == "gone":
                    self._pids.clear()
        for pid in self._pids.values():
            _signal(pid, signal.SIGKILL)
        self._zygote.stop()
        self._listener.close()
        self.registry.close()
        log.info("recserve stopped")


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _describe_exit(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
