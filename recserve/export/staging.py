"""Writing a directory atomically: stage it beside its target, then rename it into place.

The stage is a hidden sibling (name starting with "."), so on the same filesystem the
rename is atomic and readers that skip dot-names (`recserve.model_store.versions`) never
see a half-written version even if the writer dies. Every file and directory is fsynced
before the rename, the parent after it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recserve.errors import StorageError
from recserve.model_store.manifest import MANIFEST_NAME, FileEntry, Manifest

__all__ = ["STAGE_PREFIX", "file_entries", "staged_dir", "write_manifest"]

STAGE_PREFIX = ".tmp-"


@contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """Yield an empty stage directory that becomes `target` when the block succeeds."""
    if target.exists():
        raise StorageError(f"{target} already exists; a version or model dir is never overwritten")
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = target.parent / f"{STAGE_PREFIX}{target.name}-{uuid.uuid4().hex[:12]}"
    stage.mkdir()
    try:
        yield stage
        _fsync_tree(stage)
        if target.exists():
            raise StorageError(f"{target} appeared while it was being written; not overwritten")
        try:
            os.rename(stage, target)
        except OSError as exc:
            raise StorageError(f"cannot rename {stage} to {target}: {exc.strerror}") from exc
        _fsync_path(target.parent)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)


def write_manifest(version_dir: Path, manifest: Manifest) -> None:
    (version_dir / MANIFEST_NAME).write_text(manifest.dumps() + "\n", encoding="utf-8")


def file_entries(root: Path) -> dict[str, FileEntry]:
    """Size and sha256 of every file under `root`, keyed by '/'-separated relative path."""
    entries: dict[str, FileEntry] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        with open(path, "rb") as f:
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        entries[path.relative_to(root).as_posix()] = FileEntry(path.stat().st_size, digest)
    return entries


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for filename in filenames:
            _fsync_path(Path(dirpath) / filename)
        _fsync_path(Path(dirpath))


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
