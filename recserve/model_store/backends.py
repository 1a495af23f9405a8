"""Choosing the storage backend from the config, and copying a remote dir to local disk.

`model_store_type` and the schemes of `savedmodel_dir`/`checkpoint_dir` are checked
against each other when the config is parsed (`ProcessorConfig`: "local" reads local
paths, "oss" oss:// or s3://, "s3" s3://, "hdfs" hdfs://), so here the type alone picks
the backend.
"""

from __future__ import annotations

import os
import tempfile

from recserve.config import ProcessorConfig
from recserve.errors import StorageError
from recserve.model_store.hdfs import hdfs_storage
from recserve.model_store.oss import ObjectStorage
from recserve.model_store.storage import LocalStorage, Storage, join

__all__ = ["copy_to_local", "storage_for"]

COPY_CHUNK = 8 << 20


def storage_for(config: ProcessorConfig) -> Storage:
    """The backend that reads `config`'s savedmodel_dir and checkpoint_dir."""
    store = config.model_store_type
    if store == "local":
        return LocalStorage()
    if store in ("oss", "s3"):
        return ObjectStorage(
            endpoint=config.oss_endpoint,
            access_id=config.oss_access_id.reveal() if config.oss_access_id else None,
            access_key=config.oss_access_key.reveal() if config.oss_access_key else None,
        )
    if store == "hdfs":
        return hdfs_storage(config.checkpoint_dir or config.savedmodel_dir)
    raise StorageError(f"model_store_type {store!r} has no backend; valid values are local, oss, s3, hdfs")


def copy_to_local(storage: Storage, path: str, dest_parent: str | None = None) -> str:
    """Copy the tree at `path` into a new local directory and return it.

    ONNX Runtime opens model files by local path, so a remote savedmodel_dir is copied
    once at startup. Files are streamed in chunks: a multi-GB external-data file never
    sits in memory whole."""
    if storage.local_path(path) is not None:
        return storage.local_path(path)  # type: ignore[return-value]
    if not storage.is_dir(path):
        raise StorageError(f"cannot copy {path}: it is not a directory")
    dest = tempfile.mkdtemp(prefix="recserve-model-", dir=dest_parent)
    _copy_tree(storage, path, dest)
    return dest


def _copy_tree(storage: Storage, path: str, dest: str) -> None:
    for name in storage.list(path):
        source, target = join(path, name), os.path.join(dest, name)
        size = storage.size(source)
        if size is None:
            os.mkdir(target)
            _copy_tree(storage, source, target)
            continue
        with open(target, "wb") as f:
            f.writelines(storage.read_range(source, start, min(COPY_CHUNK, size - start)) for start in range(0, size, COPY_CHUNK))
