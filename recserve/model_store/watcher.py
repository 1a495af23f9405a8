"""The source of new versions: what in `checkpoint_dir` is complete and newer than what serves.

A version or delta is offered only once its MANIFEST is present and every file matches it
(`verify`). One that is still being written ("not ready") or corrupt is skipped, counted
and logged with its reason, and looked at again only after a backoff
(`Backoff.compute(failures)` seconds) — re-hashing a multi-GB corrupt version on every poll
would cost more than serving. Deltas are offered in step order and never past one that is
not ready or is corrupt: applying a later delta first would lose the earlier one's rows.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from recserve.errors import ModelLoadError, StorageError, VersionNotReadyError
from recserve.model_store.backoff import Backoff
from recserve.model_store.load_progress import LoadProgress
from recserve.model_store.manifest import Manifest, verify
from recserve.model_store.snapshot import ManifestCache, TreeSnapshot
from recserve.model_store.storage import Storage, join
from recserve.model_store.versions import (
    DELTA_DIR_NAMES,
    VersionRef,
    list_deltas,
    list_full_versions,
    read_delta_manifest,
    read_version_manifest,
)

__all__ = ["Candidate", "FailureCounts", "VersionWatcher"]

log = logging.getLogger("recserve.model_store")


@dataclass(frozen=True)
class Candidate:
    """A verified version or delta: safe to load."""

    ref: VersionRef
    manifest: Manifest


@dataclass
class FailureCounts:
    """How often each kind of problem was met. Mutated only by its owner's thread."""

    storage: int = 0     # the store was unreachable or failed a request
    not_ready: int = 0   # MANIFEST present but files missing or short
    corrupt: int = 0     # sizes or checksums differ, unreadable files
    wrong_base: int = 0  # a delta that does not fit the version it would update
    load: int = 0        # a verified version that failed to build or warm up
    memory: int = 0      # a full version estimated not to fit in the memory left (not built)
    internal: int = 0    # a bug in recserve, caught so the updater keeps running

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


@dataclass
class _Quarantine:
    failures: int
    retry_at: float
    reason: str = field(default="")


class _NewDeltasOnly:
    """A view of a Storage in which delta directories named by a step <= `after_step` are
    not listed, so each poll reads the manifests of new deltas only (DESIGN §4 names delta
    dirs by their step). On an object store that is two requests per poll instead of three
    per delta ever written."""

    def __init__(self, storage: Storage, version_dir: str, after_step: int) -> None:
        self._storage = storage
        self._parents = {join(version_dir, name) for name in DELTA_DIR_NAMES}
        self._after = after_step

    def list(self, path: str) -> list[str]:
        names = self._storage.list(path)
        if path not in self._parents:
            return names
        return [n for n in names if not (n.isdigit() and int(n) <= self._after)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self._storage, name)


class VersionWatcher:
    """Finds complete full versions and deltas in one checkpoint dir.

    Not thread-safe: one owner (the updater, under its lock) calls it."""

    def __init__(
        self,
        storage: Storage,
        checkpoint_dir: str,
        *,
        backoff: Backoff,
        clock: Callable[[], float] = time.monotonic,
        progress: LoadProgress | None = None,
    ) -> None:
        # Begun as a full version's checksums are verified; the updater ends it (load_progress).
        self.progress = progress
        self.storage = storage
        self.checkpoint_dir = checkpoint_dir
        self.counts = FailureCounts()
        self.last_error: str | None = None
        self._backoff = backoff
        self._clock = clock
        self._quarantine: dict[str, _Quarantine] = {}
        self._view: Storage = storage
        self._manifests: ManifestCache = {}

    def refresh(self) -> None:
        """Start a poll: on a store that lists a whole tree in one request (`files_under`,
        the object stores), take one snapshot of checkpoint_dir for this poll's discovery."""
        files_under = getattr(self.storage, "files_under", None)
        if files_under is not None:
            self._view = TreeSnapshot(self.storage, self.checkpoint_dir, files_under(self.checkpoint_dir),
                                      self._manifests)

    @property
    def reader(self) -> Storage:
        """Where this poll reads versions from: the storage, or its snapshot for this poll."""
        return self._view

    # -- failures ------------------------------------------------------------------------

    def record_failure(self, kind: str, path: str, exc: Exception) -> None:
        """Count a failure of the version or delta at `path`; skip it until its backoff ends."""
        setattr(self.counts, kind, getattr(self.counts, kind) + 1)
        entry = self._quarantine.get(path)
        failures = entry.failures + 1 if entry else 1
        delay = self._backoff.compute(failures)
        self._quarantine[path] = _Quarantine(failures, self._clock() + delay, str(exc))
        self.last_error = f"{kind}: {exc}"
        level = logging.INFO if kind == "not_ready" else logging.WARNING
        log.log(level, "skipping %s (%s, failure %d; next look in %.1f s): %s", path, kind, failures, delay, exc)

    def record_storage_failure(self, exc: StorageError) -> None:
        self.counts.storage += 1
        self.last_error = f"storage: {exc}"

    def _waiting(self, path: str) -> bool:
        entry = self._quarantine.get(path)
        return entry is not None and self._clock() < entry.retry_at

    def _check(self, ref: VersionRef, *, full: bool = True) -> Candidate | None:
        """The verified candidate, or None (failure recorded) if it is not ready or corrupt."""
        if self._waiting(ref.path):
            return None
        try:
            manifest = (read_version_manifest if full else read_delta_manifest)(self._view, ref.path)
            self._verify(self._view, ref, manifest, full=full)
        except StorageError:
            raise
        except VersionNotReadyError as exc:
            self.record_failure("not_ready", ref.path, exc)
            return None
        except ModelLoadError as exc:
            self.record_failure("corrupt", ref.path, exc)
            return None
        self._quarantine.pop(ref.path, None)
        return Candidate(ref, manifest)

    def _verify(self, storage: Storage, ref: VersionRef, manifest: Manifest, *, full: bool) -> None:
        progress = self.progress if full else None
        if progress is None:
            verify(storage, ref.path, manifest)
            return
        # Checksums, then the tables' build: each file's bytes count twice.
        progress.begin(f"version {ref.name}", 2 * sum(e.size for e in manifest.files.values()))
        try:
            verify(storage, ref.path, manifest, progress.advance)
        except BaseException:
            progress.end()
            raise

    # -- discovery -----------------------------------------------------------------------

    def newest_full(self, *, newer_than: VersionRef | None) -> Candidate | None:
        """The newest complete full version ordered after `newer_than` (by step, then name)."""
        floor = (newer_than.global_step, newer_than.name) if newer_than else None
        for ref in reversed(list_full_versions(self._view, self.checkpoint_dir)):
            if floor is not None and (ref.global_step, ref.name) <= floor:
                return None
            candidate = self._check(ref)
            if candidate is not None:
                return candidate
        return None

    def full(self, name: str) -> Candidate:
        """The full version called `name`, verified now (ignoring any backoff); raises
        VersionNotReadyError / CorruptVersionError / StorageError with the reason."""
        path = join(self.checkpoint_dir, name)
        if not self.storage.is_dir(path):
            found = [ref.name for ref in list_full_versions(self.storage, self.checkpoint_dir)]
            raise VersionNotReadyError(f"version {name!r} is not in {self.checkpoint_dir}; versions there: {found}")
        manifest = read_version_manifest(self.storage, path)
        if manifest.kind != "full":
            raise ModelLoadError(f"{path} is a {manifest.kind} version; only a full version can be loaded")
        ref = VersionRef(name, path, manifest.global_step)
        self._verify(self.storage, ref, manifest, full=True)
        self._quarantine.pop(path, None)
        return Candidate(ref, manifest)

    def pinned(self, name: str, *, serving: VersionRef | None) -> Candidate | None:
        """The pinned version `name` when it is not the one serving and is complete."""
        if serving is not None and serving.name == name:
            return None
        path = join(self.checkpoint_dir, name)
        if self._waiting(path) or not self._view.is_dir(path):
            return None
        try:
            manifest = read_version_manifest(self._view, path)
        except VersionNotReadyError:
            return None  # no MANIFEST yet: nothing to count
        except StorageError:
            raise
        except ModelLoadError as exc:
            self.record_failure("corrupt", path, exc)
            return None
        return self._check(VersionRef(name, path, manifest.global_step))

    def deltas(self, full: VersionRef, after_step: int) -> list[Candidate]:
        """Complete deltas of `full` newer than `after_step`, in step order, up to the first
        that is not ready, corrupt or still in its backoff."""
        view = _NewDeltasOnly(self._view, full.path, after_step)
        out: list[Candidate] = []
        # A delta dir without its MANIFEST is an upload in progress: not worth a log line.
        for ref in list_deltas(view, full.path, after_step):
            candidate = self._check(ref, full=False)
            if candidate is None:
                break
            out.append(candidate)
        return out
