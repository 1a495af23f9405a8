"""`ModelUpdater`: keeps one model serving the newest (or the pinned) version of its checkpoint
dir, on its own thread, without ever stopping service.

A poll asks the `VersionWatcher` for a newer complete full version. If there is one, it is
built off the request path (`build`), brought up to date with its complete deltas, warmed
up, and only then swapped in (`ServableManager.swap`): requests in flight finish on the
old servable, which is closed when its last lease ends. Otherwise the serving version's
new deltas are applied to its tables in place; the embedding engine guarantees a reader
sees each row entirely old or entirely new. (A delta touching several tables is applied
table by table: a request may see one table updated and another not yet.)

Failures never stop the thread and never touch what serves: a version or delta that is
not ready, corrupt, does not fit the serving version, or fails to build or warm up is
counted, logged and retried after a backoff (`VersionWatcher`); a storage outage fails the
whole poll, which `Retry` repeats with backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from recserve.errors import (
    ConfigError,
    CorruptVersionError,
    InternalError,
    ModelLoadError,
    RecserveError,
    StorageError,
)
from recserve.model_store.backoff import Backoff, Retry, Stopped, event_wait
from recserve.model_store.checkpoint import Checkpoint, load_checkpoint
from recserve.model_store.in_place import in_place_blocker, write_in_place
from recserve.model_store.memory_budget import MemoryBudgetError, check_fits
from recserve.model_store.versions import VersionRef
from recserve.model_store.watcher import Candidate, VersionWatcher

__all__ = ["ModelUpdater", "WrongBaseError", "apply_delta", "check_delta"]

log = logging.getLogger("recserve.model_store")


class WrongBaseError(CorruptVersionError):
    """A delta that cannot have been written for the version it would update."""


class _Table(Protocol):
    dim: int

    def upsert(self, keys: Any, values: Any) -> None: ...

    def delete(self, keys: Any) -> None: ...


class _Servable(Protocol):
    version: str
    tables: Mapping[str, Any]
    delta_step: int
    lost_beyond_repair: str | None

    def apply_delta(self, delta: Checkpoint) -> int: ...

    def local_names(self, delta: Checkpoint) -> Checkpoint: ...

    def close(self) -> None: ...


def check_delta(tables: Mapping[str, _Table], delta: Checkpoint, base: VersionRef) -> None:
    """Raise WrongBaseError / CorruptVersionError unless `delta` can update `tables` of `base`."""
    where = f"delta {delta.ref.path}"
    if delta.dense:
        raise CorruptVersionError(
            f"{where} carries dense.safetensors; dense parameters change only with a full version"
        )
    recorded = delta.manifest.base_global_step
    if recorded is not None and recorded != base.global_step:
        raise WrongBaseError(
            f"{where} was written on a full version at global_step {recorded}, but version "
            f"{base.name} has global_step {base.global_step}"
        )
    if delta.ref.global_step <= base.global_step:
        raise WrongBaseError(
            f"{where} has global_step {delta.ref.global_step}, not after version {base.name}'s {base.global_step}"
        )
    known = [name for name in delta.tables if name in tables]
    if delta.tables and not known:
        raise WrongBaseError(
            f"{where} updates tables {sorted(delta.tables)}; version {base.name} serves tables {sorted(tables)}"
        )
    for name in known:
        dim, want = delta.tables[name].dim, tables[name].dim
        if dim != want:
            raise WrongBaseError(f"{where}: table {name!r} has dim {dim}; version {base.name} serves dim {want}")


def apply_delta(tables: Mapping[str, _Table], delta: Checkpoint) -> int:
    """Upsert the delta's rows, then delete its `deleted` keys; returns rows changed.
    Tables the model does not bind are skipped, as in a full version."""
    changed = 0
    for name, data in delta.tables.items():
        table = tables.get(name)
        if table is None:
            continue
        if len(data.keys):
            table.upsert(data.keys, data.values)
        if data.deleted is not None and len(data.deleted):
            table.delete(data.deleted)
        changed += len(data.keys) + (0 if data.deleted is None else len(data.deleted))
    return changed


class ModelUpdater:
    """Polls a checkpoint dir and keeps `manager` serving its newest (or pinned) version.

    Thread-safe: `poll_once`, `load_version` and `load_initial` serialise on one lock, so
    an admin's `load_version` waits for a poll in progress; `status` may be called from
    any thread at any time. `build(checkpoint)` makes a servable (off the request path);
    `warmup(servable)` runs before it serves."""

    def __init__(
        self,
        watcher: VersionWatcher,
        manager: Any,
        build: Callable[..., _Servable],
        *,
        interval: float,
        warmup: Callable[[Any], object] | None = None,
        pinned: str | None = None,
        backoff: Backoff | None = None,
        wait: Callable[[float], bool] | None = None,
        clock: Callable[[], float] = time.monotonic,
        model_name: str = "default",
        load_tables: bool = True,
        available_memory: Callable[[], int | None] | None = None,
        full_update_mode: str = "swap",
    ) -> None:
        self.watcher = watcher
        # "in_place": a full version with the serving version's tables is written into them
        # (recserve.model_store.in_place) instead of being built beside them.
        self._full_update_mode = full_update_mode
        # False: full versions reach `build` without their table rows (Checkpoint.with_tables
        # reads them on demand): tables served from Redis are read only by their importer.
        self._load_tables = load_tables
        # Bytes the process may still use (memory_budget.available_memory); None: no check
        # (tables that do not live in this process's memory: Redis, an SSD tier).
        self._available_memory = available_memory
        self._manager = manager
        self._build = build
        self._warmup = warmup
        self._interval = interval
        self._pinned = pinned
        self._clock = clock
        self._name = model_name
        self._stop = threading.Event()
        self._retry = Retry(backoff or Backoff(base=interval, cap=max(60.0, interval)), wait or event_wait(self._stop))
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._serving: VersionRef | None = None
        self._delta_step = 0
        self._update_time: float | None = None
        self._full_updates = 0
        self._delta_updates = 0

    # -- reporting -----------------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        serving = self._serving
        return {
            "version": serving.name if serving else None,
            "global_step": serving.global_step if serving else None,
            "delta_step": self._delta_step,
            "update_time": self._update_time,
            "pinned_version": self._pinned,
            "full_updates": self._full_updates,
            "delta_updates": self._delta_updates,
            "failures": self.watcher.counts.as_dict(),
            "last_error": self.watcher.last_error,
        }

    # -- one poll ------------------------------------------------------------------------

    def poll_once(self) -> bool:
        """Load a newer full version or apply new deltas; True if what serves changed.
        Raises StorageError when the store fails (counted); other problems are recorded."""
        with self._lock:
            try:
                return self._poll()
            except StorageError as exc:
                self.watcher.record_storage_failure(exc)
                raise

    def _poll(self) -> bool:
        self.watcher.refresh()
        serving = self._serving
        if self._pinned is not None:
            candidate = self.watcher.pinned(self._pinned, serving=serving)
        else:
            candidate = self.watcher.newest_full(newer_than=serving) or self._instead_of_lost(serving)
        if candidate is not None:
            try:
                self._load_full(candidate)
                return True
            except StorageError:
                raise
            except MemoryBudgetError as exc:
                self.watcher.record_failure("memory", candidate.ref.path, exc)
            except ModelLoadError as exc:
                self.watcher.record_failure("load", candidate.ref.path, exc)
        if serving is None:
            return False
        newest = max(self._delta_step, serving.global_step)
        with self._manager.acquire() as servable:
            applied = self._apply_deltas(servable, serving, newest)
        if applied == newest:
            return False
        self._delta_step = applied
        self._update_time = time.time()
        return True

    def _instead_of_lost(self, serving: VersionRef | None) -> Candidate | None:
        """The newest complete version, an older one too, when the serving version can no
        longer be served (its rows lost from Redis, its files gone): better an older model
        than an error for every request that misses the cache."""
        servable = self._manager.current
        why = servable.lost_beyond_repair if servable is not None else None
        if not why or serving is None:
            return None
        candidate = self.watcher.newest_full(newer_than=None)
        if candidate is None or candidate.ref.name == serving.name:
            return None
        log.warning("model %r: version %s cannot be served any more (%s); loading version %s, the newest "
                    "complete one", self._name, serving.name, why, candidate.ref.name)
        return candidate

    def _apply_deltas(self, servable: _Servable, base: VersionRef, after_step: int) -> int:
        """Apply `base`'s complete deltas newer than `after_step`; returns the last step applied."""
        applied = after_step
        for candidate in self.watcher.deltas(base, applied):
            started = self._clock()
            try:
                delta = servable.local_names(load_checkpoint(self.watcher.reader, candidate.ref, candidate.manifest))
                check_delta(servable.tables, delta, base)
            except StorageError:
                raise
            except WrongBaseError as exc:
                self.watcher.record_failure("wrong_base", candidate.ref.path, exc)
                break
            except ModelLoadError as exc:
                self.watcher.record_failure("corrupt", candidate.ref.path, exc)
                break
            rows = servable.apply_delta(delta)
            applied = candidate.ref.global_step
            servable.set_delta_step(applied)
            self._delta_updates += 1
            log.info("model %r: applied delta %s of version %s (%d rows) in %.3f s",
                     self._name, candidate.ref.name, base.name, rows, self._clock() - started)
        return applied

    def _load_full(self, candidate: Candidate) -> None:
        """Build, update with deltas, warm up and swap in `candidate`; raises ModelLoadError or
        StorageError (then nothing changed)."""
        try:
            self._build_and_swap(candidate)
        finally:
            if self.watcher.progress is not None:
                self.watcher.progress.end()

    def _build_and_swap(self, candidate: Candidate) -> None:
        started = self._clock()
        ref = candidate.ref
        if self._full_update_mode == "in_place" and self._serving is not None:
            with self._manager.acquire() as current:
                reason = in_place_blocker(current, candidate.manifest)
                if reason is None:
                    self._write_in_place(candidate, current, started)
                    return
            log.info("model %r: version %s is built and swapped in, not written in place: %s",
                     self._name, ref.name, reason)
        if self._available_memory is not None:
            try:
                check_fits(candidate.manifest, ref.name, self._available_memory())
            except MemoryBudgetError as exc:
                if self._full_update_mode == "swap":
                    exc.message += ('; full_update_mode "in_place" writes a version with the same tables '
                                    "into the serving ones without a second copy")
                raise
        servable = self._build_checked(
            ref, load_checkpoint(self.watcher.reader, ref, candidate.manifest, tables=self._load_tables))
        delta_step = self._deltas_and_warmup(servable, ref)
        self._manager.swap(servable)
        self._served(ref, delta_step)
        log.info("model %r: serving version %s (global_step %d, deltas to %d), ready in %.2f s",
                 self._name, ref.name, ref.global_step, self._delta_step, self._clock() - started)

    def _write_in_place(self, candidate: Candidate, current: Any, started: float) -> None:
        """The version's rows into the serving tables, then new sessions over them, warmed up
        and swapped in; raises like _build_and_swap. model_info() names the new version only
        once every table is written."""
        ref = candidate.ref
        rows = write_in_place(self.watcher.reader, ref, candidate.manifest, current.tables)
        servable = self._build_checked(
            ref, load_checkpoint(self.watcher.reader, ref, candidate.manifest, tables=False), current.tables)
        servable.owns_tables = False  # until it serves: closing it on a failure leaves the tables
        delta_step = self._deltas_and_warmup(servable, ref)
        servable.owns_tables, current.owns_tables = True, False
        self._manager.swap(servable)
        self._served(ref, delta_step)
        log.info("model %r: serving version %s (global_step %d, deltas to %d), written in place "
                 "(%d rows) in %.2f s", self._name, ref.name, ref.global_step, self._delta_step, rows,
                 self._clock() - started)

    def _build_checked(self, ref: VersionRef, checkpoint: Checkpoint, tables: Any = None) -> _Servable:
        """The servable of `ref`; an error that is not a RecserveError becomes the
        ModelLoadError naming the version."""
        try:
            return self._build(checkpoint) if tables is None else self._build(checkpoint, tables=tables)
        except RecserveError:
            raise
        except Exception as exc:  # onnxruntime and the engine raise their own types
            raise ModelLoadError(f"version {ref.name} cannot be built: {type(exc).__name__}: {exc}") from exc

    def _deltas_and_warmup(self, servable: _Servable, ref: VersionRef) -> int:
        """`ref`'s deltas applied to a servable not yet serving, then warmed up: the delta
        step reached. The servable is closed if either fails."""
        try:
            delta_step = self._apply_deltas(servable, ref, ref.global_step)
            if self._warmup is not None:
                self._warmup(servable)
        except BaseException:
            servable.close()
            raise
        return delta_step

    def _served(self, ref: VersionRef, delta_step: int) -> None:
        self._serving = ref
        self._delta_step = 0 if delta_step == ref.global_step else delta_step
        self._update_time = time.time()
        self._full_updates += 1

    # -- rollback and pinning ------------------------------------------------------------

    def load_version(self, name: str | None) -> dict[str, Any]:
        """Pin `name` and serve it now (rollback), or with None unpin and serve the newest.
        Raises ModelLoadError (not found, not ready, corrupt, fails to build) or StorageError;
        then what serves and the pin are unchanged. Returns `status()`."""
        with self._lock:
            self.watcher.refresh()
            if name is None:
                self._pinned = None
                log.info("model %r: unpinned; following the newest version", self._name)
                self.poll_once()
                return self.status()
            if self._serving is None or self._serving.name != name:
                self._load_full(self.watcher.full(name))
            self._pinned = name
            log.info("model %r: pinned to version %s", self._name, name)
            return self.status()

    # -- the thread ----------------------------------------------------------------------

    def load_initial(self, timeout: float | None) -> None:
        """Poll until a version serves; ModelLoadError if none does within `timeout` seconds
        (None: wait without limit). A ConfigError (a setting no retry fixes) is raised at once."""
        deadline = None if timeout is None else self._clock() + timeout
        logged = False
        while True:
            try:
                self.poll_once()
            except ConfigError:
                raise  # a setting no retry fixes (e.g. a password the store refuses)
            except RecserveError as exc:
                log.warning("model %r: looking for a first version: %s", self._name, exc)
            if self._serving is not None:
                return
            remaining = None if deadline is None else deadline - self._clock()
            if remaining is not None and remaining <= 0:
                problem = self.watcher.last_error or "it holds no version with a MANIFEST.json"
                raise ModelLoadError(
                    f"model {self._name!r}: no complete version appeared in {self.watcher.checkpoint_dir} "
                    f"within {timeout:g} s; last problem: {problem}"
                )
            if not logged:
                log.info("model %r: waiting for a complete version in %s", self._name, self.watcher.checkpoint_dir)
                logged = True
            if not self._retry.wait(self._interval if remaining is None else min(self._interval, remaining)):
                raise ModelLoadError(f"model {self._name!r}: closed while waiting for a first version")

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name=f"recserve-updater-{self._name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop polling; waits for a load in progress to finish (up to `timeout`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _guarded_poll(self) -> bool:
        try:
            return self.poll_once()
        except RecserveError:
            raise
        except Exception as exc:  # a bug: keep serving and keep polling, loudly
            log.exception("model %r: update failed unexpectedly", self._name)
            self.watcher.counts.internal += 1
            self.watcher.last_error = f"internal: {type(exc).__name__}: {exc}"
            raise InternalError(f"update failed: {type(exc).__name__}: {exc}") from exc

    def _on_poll_error(self, exc: RecserveError, failures: int) -> None:
        log.warning("model %r: poll of %s failed (%d in a row; retrying in %.1f s): %s",
                    self._name, self.watcher.checkpoint_dir, failures, self._retry.backoff.compute(failures), exc)

    def _run(self) -> None:
        while True:
            # Polls start every `interval` (not `interval` after the last one ended), so a
            # delta waits at most one interval plus one poll to be seen.
            started = self._clock()
            try:
                self._retry.call(self._guarded_poll, self._on_poll_error)
            except Stopped:
                return
            if not self._retry.wait(max(0.0, self._interval - (self._clock() - started))):
                return
