"""A checkpoint dir as one listing saw it: `list`, `is_dir` and `size` answered from memory.

On an object store every `list`/`is_dir`/`size` is an HTTP request, and discovering
versions and deltas costs a few per version per poll; with a snapshot a poll costs one
listing plus reads of what is new. Published MANIFEST.json files are cached by (path,
size, ETag): they are written once, last, and a rewrite changes the ETag. A small file
read whole (as `verify` reads it to hash it) is kept until it is next read whole (as the
loader reads it right after), so a new delta crosses the network once, not twice.
"""

from __future__ import annotations

from collections.abc import Mapping

from recserve.model_store.manifest import HASH_CHUNK, MANIFEST_NAME
from recserve.model_store.storage import Storage

__all__ = ["TreeSnapshot"]

ManifestCache = dict[tuple[str, int, str], bytes]


class TreeSnapshot:
    """`Storage` view of the tree under `root` as listed once (`files`: relative path ->
    (size, tag)); paths outside `root` and all reads but cached manifests go to `storage`.
    Immutable after construction except for the shared manifest cache; used by one thread."""

    def __init__(self, storage: Storage, root: str, files: Mapping[str, tuple[int, str]],
                 manifest_cache: ManifestCache) -> None:
        self._storage = storage
        self._root = root.rstrip("/")
        self._files = files
        self._cache = manifest_cache
        self._whole: dict[str, bytes] = {}
        self._children: dict[str, set[str]] = {}
        for rel in files:
            parts = rel.split("/")
            for depth in range(len(parts)):
                self._children.setdefault("/".join(parts[:depth]), set()).add(parts[depth])
        live = {(self._root + "/" + rel, *entry) for rel, entry in files.items() if rel.endswith(MANIFEST_NAME)}
        for key in [k for k in manifest_cache if k not in live]:
            del manifest_cache[key]

    def _rel(self, path: str) -> str | None:
        path = path.rstrip("/")
        if path == self._root:
            return ""
        if path.startswith(self._root + "/"):
            return path[len(self._root) + 1:]
        return None

    def list(self, path: str) -> list[str]:
        rel = self._rel(path)
        return self._storage.list(path) if rel is None else sorted(self._children.get(rel, ()))

    def is_dir(self, path: str) -> bool:
        rel = self._rel(path)
        return self._storage.is_dir(path) if rel is None else rel in self._children

    def size(self, path: str) -> int | None:
        rel = self._rel(path)
        if rel is None:
            return self._storage.size(path)
        entry = self._files.get(rel)
        return None if entry is None else entry[0]

    def read(self, path: str) -> bytes:
        rel = self._rel(path)
        entry = self._files.get(rel) if rel is not None else None
        kept = self._whole.pop(path, None)
        if kept is not None:
            return kept
        if entry is None or not path.endswith(MANIFEST_NAME):
            return self._storage.read(path)
        key = (self._root + "/" + rel, *entry)  # type: ignore[operator]
        data = self._cache.get(key)
        if data is None:
            data = self._storage.read(path)
            if len(data) == entry[0]:
                self._cache[key] = data
        return data

    def read_range(self, path: str, start: int, length: int) -> bytes:
        data = self._storage.read_range(path, start, length)
        if start == 0 and len(data) <= HASH_CHUNK and len(data) == self.size(path):
            self._whole[path] = data
        return data

    def local_path(self, path: str) -> str | None:
        return self._storage.local_path(path)
