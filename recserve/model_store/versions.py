"""Finding versions in a checkpoint dir: full versions, the newest complete one, its deltas.

Full versions are the child directories of `checkpoint_dir` (any name), ordered by their
MANIFEST's `global_step`, then name. Deltas live in `<version>/.incremental_ckpt/<step>/`.
DeepRec's docs name that directory `.incremental_ckpt` while its code writes
`.incremental_checkpoint`; both are read. Names starting with "." are never versions: that
is where writers stage a version before renaming it into place (`recserve.export`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from recserve.errors import CorruptVersionError, ModelLoadError, VersionNotReadyError
from recserve.model_store.manifest import DELTA_DIR_NAMES, MANIFEST_NAME, Manifest, read_manifest, verify
from recserve.model_store.storage import Storage, join
from recserve.model_store.tf_checkpoint import (
    STATE_FILE,
    is_tf_version,
    tf_delta,
    tf_delta_manifest,
    tf_version_manifest,
)

__all__ = [
    "DELTA_DIR_NAMES",
    "VersionRef",
    "list_deltas",
    "list_full_versions",
    "newest_complete_version",
    "read_delta_manifest",
    "read_version_manifest",
]



@dataclass(frozen=True)
class VersionRef:
    """A full version or a delta: its directory name, full path and global step."""

    name: str
    path: str
    global_step: int


def read_version_manifest(storage: Storage, version_dir: str) -> Manifest:
    """A version directory's manifest: its MANIFEST.json (recserve's format), or one made
    from its TensorFlow checkpoint (a `checkpoint` state file, DESIGN §4b); a TF delta is
    read by list_deltas. Both in one directory is an error naming both."""
    if is_tf_version(storage, version_dir):
        if storage.size(join(version_dir, MANIFEST_NAME)) is not None:
            raise CorruptVersionError(
                f"{version_dir} holds both {MANIFEST_NAME} (a recserve version) and a TensorFlow "
                f"'{STATE_FILE}' state file (a TF checkpoint); a version is one or the other")
        return tf_version_manifest(storage, version_dir)
    return read_manifest(storage, version_dir)


def read_delta_manifest(storage: Storage, path: str) -> Manifest:
    """A delta's manifest: recserve's MANIFEST.json, or that of a TF incremental bundle
    (`path` is then the bundle's prefix)."""
    if storage.size(path + ".index") is not None:
        return tf_delta_manifest(storage, path)
    return read_manifest(storage, path)


def _scan(
    storage: Storage, parent: str, kind: str
) -> tuple[list[tuple[VersionRef, Manifest]], dict[str, ModelLoadError]]:
    """Child dirs of `parent` with a readable manifest of `kind`, and why the others failed."""
    found: list[tuple[VersionRef, Manifest]] = []
    problems: dict[str, ModelLoadError] = {}
    for name in storage.list(parent):
        path = join(parent, name)
        if name.startswith(".") or not storage.is_dir(path):
            continue
        try:
            manifest = read_version_manifest(storage, path) if kind == "full" else read_manifest(storage, path)
        except ModelLoadError as exc:
            problems[name] = exc
            continue
        if manifest.kind != kind:
            problems[name] = CorruptVersionError(
                f"{path}: MANIFEST.json has kind {manifest.kind!r}; expected {kind!r} here"
            )
            continue
        found.append((VersionRef(name, path, manifest.global_step), manifest))
    found.sort(key=lambda item: (item[0].global_step, item[0].name))
    return found, problems


def list_full_versions(storage: Storage, checkpoint_dir: str) -> list[VersionRef]:
    """Full versions with a readable MANIFEST, oldest first. Files are not verified here."""
    return [ref for ref, _ in _scan(storage, checkpoint_dir, "full")[0]]


def newest_complete_version(
    storage: Storage, checkpoint_dir: str, *, log: logging.Logger
) -> tuple[VersionRef, Manifest]:
    """The newest full version whose files all match its MANIFEST.

    Newer versions that are incomplete or corrupt are skipped, each logged with its reason
    (INFO when still being written, WARNING when corrupt)."""
    found, problems = _scan(storage, checkpoint_dir, "full")
    for name, exc in problems.items():
        _log_skip(log, name, exc)
    for ref, manifest in reversed(found):
        try:
            verify(storage, ref.path, manifest)
        except ModelLoadError as exc:
            _log_skip(log, ref.name, exc)
            problems[ref.name] = exc
            continue
        return ref, manifest
    reasons = "; ".join(f"{name}: {exc}" for name, exc in problems.items())
    raise ModelLoadError(
        f"no complete version in {checkpoint_dir}: {reasons or 'it has no version directories'}"
    )


def _log_skip(log: logging.Logger, name: str, exc: ModelLoadError) -> None:
    level = logging.INFO if isinstance(exc, VersionNotReadyError) else logging.WARNING
    log.log(level, "skipping version %s: %s", name, exc)


def list_deltas(
    storage: Storage,
    version_dir: str,
    after_step: int,
    *,
    log: logging.Logger | None = None,
) -> list[VersionRef]:
    """Deltas of the full version at `version_dir` with global_step > `after_step`, by step.

    A delta whose MANIFEST is absent or unreadable but whose directory name is a step number
    newer than `after_step` holds back every delta from that step on: applying a later
    delta before it would lose its changes for good. Files are not verified here.
    A TensorFlow version's delta is its newest incremental bundle, the only one needed."""
    if is_tf_version(storage, version_dir):
        full_step = tf_version_manifest(storage, version_dir).global_step
        newest = tf_delta(storage, version_dir, full_step, after_step)
        if newest is None:
            return []
        prefix, manifest = newest
        return [VersionRef(prefix.rsplit("/", 1)[-1], prefix, manifest.global_step)]
    found: list[tuple[VersionRef, Manifest]] = []
    blocked_at: int | None = None
    for dir_name in DELTA_DIR_NAMES:
        parent = join(version_dir, dir_name)
        ready, problems = _scan(storage, parent, "delta")
        found.extend(ready)
        for name, exc in problems.items():
            step = int(name) if name.isdigit() else None
            if step is None or step <= after_step:
                continue
            if log is not None:
                _log_skip(log, f"{dir_name}/{name}", exc)
            blocked_at = step if blocked_at is None else min(blocked_at, step)
    refs = sorted(
        (ref for ref, _ in found if ref.global_step > after_step),
        key=lambda ref: (ref.global_step, ref.path),
    )
    if blocked_at is not None:
        refs = [ref for ref in refs if ref.global_step < blocked_at]
    return refs
