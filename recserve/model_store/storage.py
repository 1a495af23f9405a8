"""Where model dirs and checkpoints live: a small read-only interface over a file tree.

Paths are plain strings joined with ``/`` (``join``), so the same code reads a local
directory today and an object store (OSS/S3) or HDFS through another backend later.
"""

from __future__ import annotations

import os
import stat
from typing import Protocol

from recserve.errors import StorageError

__all__ = ["LocalStorage", "Storage", "join"]


class Storage(Protocol):
    """Read access to a tree of files. Implementations are thread-safe."""

    def list(self, path: str) -> list[str]:
        """Child names (files and directories) of `path`, sorted; [] if it is absent."""
        ...

    def is_dir(self, path: str) -> bool: ...

    def size(self, path: str) -> int | None:
        """Size in bytes of the file at `path`; None if there is no file there."""
        ...

    def read(self, path: str) -> bytes: ...

    def read_range(self, path: str, start: int, length: int) -> bytes:
        """Up to `length` bytes from offset `start` (fewer only at the end of the file)."""
        ...

    def local_path(self, path: str) -> str | None:
        """A local filesystem path for `path` when the backend has one, else None.

        Lets big tables be memory-mapped instead of copied through `read`."""
        ...


def join(*parts: str) -> str:
    """Join path parts with ``/``, keeping a leading scheme or root of the first part."""
    out = ""
    for part in parts:
        if not part:
            continue
        if not out:
            out = part
        elif out.endswith("/"):
            out += part.lstrip("/")
        else:
            out += "/" + part.lstrip("/")
    return out


class LocalStorage:
    """The local filesystem. Thread-safe: every call opens and closes its own file."""

    def list(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {exc.strerror}") from exc

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def size(self, path: str) -> int | None:
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as exc:
            raise StorageError(f"cannot stat {path}: {exc.strerror}") from exc
        return None if stat.S_ISDIR(st.st_mode) else st.st_size

    def read(self, path: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from exc

    def read_range(self, path: str, start: int, length: int) -> bytes:
        try:
            with open(path, "rb") as f:
                f.seek(start)
                return f.read(length)
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror}") from exc

    def local_path(self, path: str) -> str | None:
        return path
