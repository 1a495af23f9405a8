"""MANIFEST.json: what a checkpoint version or delta holds, and checking that it is all there.

A version exists only once its MANIFEST.json is present and every file it lists has the
listed size and sha256 (DESIGN §4). A file that is missing or shorter than listed is
still being written (`VersionNotReadyError`, retry later); a longer file or a checksum
mismatch is `CorruptVersionError`. Unknown top-level keys are ignored so that later
writers can add informative fields without a new format version.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

from recserve.errors import CorruptVersionError, VersionNotReadyError
from recserve.model_store.load_threads import map_in_threads
from recserve.model_store.storage import Storage, join

__all__ = [
    "FORMAT",
    "MANIFEST_NAME",
    "FileEntry",
    "Manifest",
    "check_relative_path",
    "read_manifest",
    "verify",
]

FORMAT = "recserve.checkpoint/1"
# A TensorFlow bundle found by recserve.model_store.tf_checkpoint: files with their sizes and
# no sha256 (every tensor's crc32c is checked as it is read).
TF_BUNDLE_FORMAT = "tensorflow.bundle"
MANIFEST_NAME = "MANIFEST.json"
# Where a version's deltas live: the first is what recserve writes; the second is what
# DeepRec's code writes (its docs name the first).
DELTA_DIR_NAMES = (".incremental_ckpt", ".incremental_checkpoint")
KINDS = ("full", "delta")
# Hash in pieces so a multi-GB table never sits in memory just to be checksummed.
HASH_CHUNK = 8 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    """Immutable; safe to share between threads."""

    kind: Literal["full", "delta"]
    global_step: int
    files: dict[str, FileEntry]
    format: str = FORMAT
    # A delta's optional record of the full version it was written on: the full's
    # global_step. Servers then refuse it on any other base (a full version rewritten in
    # place under the same name, deltas copied between versions). recserve.export writes it.
    base_global_step: int | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"format": self.format, "kind": self.kind, "global_step": self.global_step}
        if self.base_global_step is not None:
            doc["base_global_step"] = self.base_global_step
        doc["files"] = {name: {"size": e.size, "sha256": e.sha256} for name, e in sorted(self.files.items())}
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    @classmethod
    def from_json(cls, doc: Any, source: str = MANIFEST_NAME) -> Manifest:
        """Validate a parsed MANIFEST.json; errors are CorruptVersionError naming `source`."""

        def bad(problem: str) -> CorruptVersionError:
            return CorruptVersionError(f"{source}: {problem}")

        if not isinstance(doc, dict):
            raise bad(f"expected a JSON object, got {type(doc).__name__}")
        fmt = doc.get("format")
        if fmt != FORMAT:
            raise bad(f"'format' is {fmt!r}; the supported format is {FORMAT!r}")
        kind = doc.get("kind")
        if kind not in KINDS:
            raise bad(f"'kind' is {kind!r}; valid values are {list(KINDS)}")
        step = doc.get("global_step")
        if not _is_int(step) or step < 0:
            raise bad(f"'global_step' is {step!r}; it must be an integer >= 0")
        base = doc.get("base_global_step")
        if base is not None and (kind != "delta" or not _is_int(base) or not 0 <= base < step):
            raise bad(
                f"'base_global_step' is {base!r}; only a delta has one, an integer >= 0 below its "
                f"global_step {step}"
            )
        raw_files = doc.get("files")
        if not isinstance(raw_files, dict):
            raise bad("'files' must be an object mapping relative path -> {size, sha256}")
        files: dict[str, FileEntry] = {}
        for name, entry in raw_files.items():
            problem = check_relative_path(name)
            if problem:
                raise bad(f"file {name!r}: {problem}")
            if not isinstance(entry, dict) or set(entry) != {"size", "sha256"}:
                raise bad(f"file {name!r}: expected an object with exactly 'size' and 'sha256'")
            size, sha = entry["size"], entry["sha256"]
            if not _is_int(size) or size < 0:
                raise bad(f"file {name!r}: 'size' is {size!r}; it must be an integer >= 0")
            if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
                raise bad(f"file {name!r}: 'sha256' is {sha!r}; expected 64 lowercase hex digits")
            files[name] = FileEntry(size=size, sha256=sha)
        return cls(kind=kind, global_step=step, files=files, format=fmt, base_global_step=base)


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_relative_path(name: Any) -> str | None:
    """Why `name` is not a safe relative path inside a version dir, or None if it is."""
    if not isinstance(name, str) or not name:
        return "the path must be a non-empty string"
    if name.startswith("/") or "\\" in name or "\0" in name:
        return "the path must be relative, with '/' separators"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "the path must not contain empty, '.' or '..' components"
    return None


def read_manifest(storage: Storage, version_dir: str) -> Manifest:
    """Read and validate `<version_dir>/MANIFEST.json`."""
    path = join(version_dir, MANIFEST_NAME)
    if storage.size(path) is None:
        raise VersionNotReadyError(f"{path} is absent (the version is not complete yet)")
    raw = storage.read(path)
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise CorruptVersionError(f"{path}: not valid JSON ({exc})") from exc
    return Manifest.from_json(doc, source=path)


def verify(storage: Storage, version_dir: str, manifest: Manifest,
           progress: Callable[[int], None] | None = None) -> None:
    """Check every file listed in `manifest` against its size and sha256 (the checksums of
    several files at once: recserve.model_store.load_threads); `progress` is told the bytes
    hashed as they are."""
    files = sorted(manifest.files.items())
    if manifest.format == TF_BUNDLE_FORMAT:
        # A TF delta's path is its bundle prefix; its files sit beside it.
        where = version_dir if manifest.kind == "full" else version_dir.rsplit("/", 1)[0]
        for name, entry in files:
            if storage.size(join(where, name)) != entry.size:
                raise VersionNotReadyError(f"{join(where, name)} is missing or changed (listed by the bundle index)")
        return  # each tensor's crc32c is checked as the version loads
    for name, entry in files:
        problem = check_relative_path(name)
        if problem:
            where = join(version_dir, MANIFEST_NAME)
            raise CorruptVersionError(f"{where}: file {name!r}: {problem}")
        path = join(version_dir, name)
        size = storage.size(path)
        if size is None:
            raise VersionNotReadyError(f"{path} is missing (listed in {MANIFEST_NAME})")
        if size < entry.size:
            raise VersionNotReadyError(
                f"{path} has {size} of {entry.size} bytes (still being written)"
            )
        if size > entry.size:
            raise CorruptVersionError(
                f"{path} has {size} bytes; {MANIFEST_NAME} lists {entry.size}"
            )
    digests = map_in_threads(
        lambda item: sha256_of(storage, join(version_dir, item[0]), item[1].size, progress), files)
    for (name, entry), digest in zip(files, digests):
        if digest != entry.sha256:
            raise CorruptVersionError(
                f"{join(version_dir, name)}: sha256 is {digest}; {MANIFEST_NAME} lists {entry.sha256}"
            )


def sha256_of(storage: Storage, path: str, size: int, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    for start in range(0, size, HASH_CHUNK):
        length = min(HASH_CHUNK, size - start)
        h.update(storage.read_range(path, start, length))
        if progress is not None:
            progress(length)
    return h.hexdigest()
