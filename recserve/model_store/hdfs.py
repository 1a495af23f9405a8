"""HDFS: `hdfs://namenode[:port]/path`, through WebHDFS or through libhdfs.

Two drivers, chosen by ``RECSERVE_HDFS_DRIVER`` (`webhdfs`, `libhdfs`, or unset = libhdfs
when pyarrow can load it — it needs a JVM and the Hadoop client jars — else WebHDFS):

- `WebHdfsStorage`: the WebHDFS REST API through the `hdfs` (HdfsCLI) client. The URL's
  port is then the namenode's HTTP port (Hadoop 3's default 9870); ``RECSERVE_WEBHDFS_URL``
  ("http://nn1:9870;http://nn2:9870" for HA namenodes) overrides it. The user is
  ``HADOOP_USER_NAME`` (simple authentication; Kerberos is not supported).
- `ArrowStorage` over ``pyarrow.fs.HadoopFileSystem``: native RPC; the URL's port is the
  RPC port (default 8020).

Library errors are translated here: absent paths are None / [], everything else
(namenode unreachable, permission denied, standby namenode) is `StorageError`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any
from urllib.parse import urlsplit

from recserve.errors import StorageError

__all__ = ["ArrowStorage", "WebHdfsStorage", "hdfs_storage", "split_hdfs_url"]

log = logging.getLogger("recserve.model_store")

WEBHDFS_PORT = 9870
RPC_PORT = 8020
DRIVERS = ("webhdfs", "libhdfs")
_ABSENT = {"FileNotFoundException"}


def split_hdfs_url(url: str) -> tuple[str, int | None, str]:
    """`hdfs://nn:9870/a/b` -> ("nn", 9870, "/a/b")."""
    parts = urlsplit(url)
    if parts.scheme != "hdfs" or not parts.hostname:
        raise StorageError(f"{url!r} is not an HDFS URL; expected hdfs://namenode[:port]/path")
    return parts.hostname, parts.port, "/" + parts.path.lstrip("/")


def _short(exc: Exception, limit: int = 300) -> str:
    # libhdfs' load errors list every path it tried: hundreds of lines.
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return text if len(text) <= limit else text[:limit] + "..."


class WebHdfsStorage:
    """`Storage` over WebHDFS. Thread-safe: one HdfsCLI client per namenode, created under a
    lock; a client is a `requests.Session`, which is safe to share for these idempotent GETs."""

    def __init__(self, *, url_override: str | None = None, user: str | None = None, timeout: float = 30.0) -> None:
        self._override = url_override
        self._user = user
        self._timeout = timeout
        self._clients: dict[tuple[str, int | None], Any] = {}
        self._lock = threading.Lock()

    def _client(self, url: str) -> tuple[Any, str]:
        import hdfs  # type: ignore[import-untyped]  # the optional `hdfs` extra

        host, port, path = split_hdfs_url(url)
        with self._lock:
            client = self._clients.get((host, port))
            if client is None:
                http = self._override or f"http://{host}:{port or WEBHDFS_PORT}"
                client = hdfs.InsecureClient(http, user=self._user, timeout=self._timeout)
                self._clients[(host, port)] = client
        return client, path

    def _call(self, action: str, url: str, fn: Any) -> Any:
        import hdfs
        import requests

        try:
            return fn()
        except hdfs.util.HdfsError as exc:
            if getattr(exc, "exception", None) in _ABSENT:
                return None
            raise StorageError(f"cannot {action} {url}: {_short(exc)}") from exc
        except requests.RequestException as exc:
            raise StorageError(f"cannot {action} {url}: namenode unreachable ({_short(exc)})") from exc

    def _status(self, url: str) -> dict[str, Any] | None:
        client, path = self._client(url)
        return self._call("stat", url, lambda: client.status(path, strict=False))  # type: ignore[no-any-return]

    def list(self, path: str) -> list[str]:
        status = self._status(path)
        if status is None or status.get("type") != "DIRECTORY":
            return []
        client, hpath = self._client(path)
        names = self._call("list", path, lambda: client.list(hpath))
        return sorted(names or [])

    def is_dir(self, path: str) -> bool:
        status = self._status(path)
        return status is not None and status.get("type") == "DIRECTORY"

    def size(self, path: str) -> int | None:
        status = self._status(path)
        if status is None or status.get("type") != "FILE":
            return None
        return int(status["length"])

    def _open(self, path: str, offset: int, length: int | None) -> bytes:
        client, hpath = self._client(path)

        def read() -> bytes:
            with client.read(hpath, offset=offset, length=length) as stream:
                return stream.read()  # type: ignore[no-any-return]

        data = self._call("read", path, read)
        if data is None:
            raise StorageError(f"cannot read {path}: no such file")
        return data  # type: ignore[no-any-return]

    def read(self, path: str) -> bytes:
        return self._open(path, 0, None)

    def read_range(self, path: str, start: int, length: int) -> bytes:
        return b"" if length <= 0 else self._open(path, start, length)

    def local_path(self, path: str) -> str | None:
        return None


class ArrowStorage:
    """`Storage` over a pyarrow filesystem (`HadoopFileSystem` for hdfs:// URLs).
    Thread-safe: pyarrow filesystems are, and every call opens its own file."""

    def __init__(self, fs: Any, *, url_prefix: str = "hdfs://") -> None:
        self._fs = fs
        self._prefix = url_prefix

    def _path(self, url: str) -> str:
        if self._prefix == "hdfs://":
            return split_hdfs_url(url)[2]
        return url

    def _info(self, url: str) -> Any:
        try:
            return self._fs.get_file_info(self._path(url))
        except OSError as exc:
            raise StorageError(f"cannot stat {url}: {_short(exc)}") from exc

    def list(self, path: str) -> list[str]:
        import pyarrow.fs  # type: ignore[import-untyped]

        base = self._path(path).rstrip("/")
        if self._info(path).type != pyarrow.fs.FileType.Directory:
            return []
        try:
            infos = self._fs.get_file_info(pyarrow.fs.FileSelector(base, allow_not_found=True))
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {_short(exc)}") from exc
        return sorted(info.base_name for info in infos)

    def is_dir(self, path: str) -> bool:
        import pyarrow.fs

        return bool(self._info(path).type == pyarrow.fs.FileType.Directory)

    def size(self, path: str) -> int | None:
        import pyarrow.fs

        info = self._info(path)
        return int(info.size) if info.type == pyarrow.fs.FileType.File else None

    def read_range(self, path: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            with self._fs.open_input_file(self._path(path)) as f:
                return bytes(f.read_at(length, start))
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {_short(exc)}") from exc

    def read(self, path: str) -> bytes:
        try:
            with self._fs.open_input_file(self._path(path)) as f:
                return bytes(f.read())
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {_short(exc)}") from exc

    def local_path(self, path: str) -> str | None:
        return None


def _libhdfs(host: str, port: int | None, user: str | None) -> ArrowStorage:
    try:
        import pyarrow.fs
    except ImportError as exc:
        raise StorageError("the libhdfs driver needs pyarrow (pip install pyarrow)") from exc
    try:
        fs = pyarrow.fs.HadoopFileSystem(host, port or RPC_PORT, user=user)
    except OSError as exc:
        raise StorageError(f"cannot connect to HDFS {host}:{port or RPC_PORT} through libhdfs: {_short(exc)}") from exc
    return ArrowStorage(fs)


def hdfs_storage(url: str, env: dict[str, str] | None = None) -> WebHdfsStorage | ArrowStorage:
    """The HDFS `Storage` for the namenode of `url`, by the driver rules above."""
    env = dict(os.environ) if env is None else env
    driver = env.get("RECSERVE_HDFS_DRIVER", "").strip().lower()
    if driver and driver not in DRIVERS:
        raise StorageError(f"RECSERVE_HDFS_DRIVER is {driver!r}; valid values are {list(DRIVERS)} or unset")
    host, port, _ = split_hdfs_url(url)
    user = env.get("HADOOP_USER_NAME") or None
    if driver != "webhdfs":
        try:
            return _libhdfs(host, port, user)
        except StorageError as exc:
            if driver == "libhdfs":
                raise
            log.info("HDFS: libhdfs unavailable (%s); using WebHDFS", exc)
    return WebHdfsStorage(url_override=env.get("RECSERVE_WEBHDFS_URL") or None, user=user)
