"""The HDFS backends: WebHDFS against the WebHDFS-protocol stand-in (a real HTTP server in a
subprocess, webhdfs_standin.py — no real HDFS can run here), and the pyarrow driver's
Storage code over pyarrow's local filesystem (libhdfs itself needs a JVM and Hadoop)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from recserve.config import parse_config
from recserve.errors import StorageError
from recserve.export import write_checkpoint
from recserve.model_store import LocalStorage, load_checkpoint, newest_complete_version
from recserve.model_store.backends import storage_for
from recserve.model_store.hdfs import ArrowStorage, WebHdfsStorage, hdfs_storage, split_hdfs_url


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "deep.bin").write_bytes(bytes(range(256)) * 40)
    (root / "a" / "x.txt").write_bytes(b"hello")
    (root / "a" / "emptydir").mkdir()
    (root / "empty.bin").write_bytes(b"")
    (root / "top.txt").write_bytes(b"0123456789")


def _same_as_local(storage, base: str, local_root: Path) -> None:  # type: ignore[no-untyped-def]
    local = LocalStorage()
    for rel in ["", "a", "a/b", "a/emptydir", "missing", "top.txt"]:
        lp, rp = str(local_root / rel).rstrip("/"), f"{base}/{rel}".rstrip("/")
        assert storage.list(rp) == local.list(lp), rel
        assert storage.is_dir(rp) == local.is_dir(lp), rel
        assert storage.size(rp) == local.size(lp), rel
    for rel in ["a/b/deep.bin", "a/x.txt", "empty.bin", "top.txt"]:
        lp, rp = str(local_root / rel), f"{base}/{rel}"
        assert storage.read(rp) == local.read(lp)
        for start, length in [(0, 3), (5, 100), (10, 5), (9000, 10), (3, 0)]:
            assert storage.read_range(rp, start, length) == local.read_range(lp, start, length)


def test_webhdfs_reads_like_local_storage(webhdfs):
    _tree(webhdfs.root / "data")
    _same_as_local(WebHdfsStorage(), f"{webhdfs.url}/data", webhdfs.root / "data")


def test_arrow_storage_reads_like_local_storage(tmp_path):
    fs = pytest.importorskip("pyarrow.fs")
    _tree(tmp_path / "data")
    _same_as_local(ArrowStorage(fs.LocalFileSystem(), url_prefix=""), str(tmp_path / "data"), tmp_path / "data")


def test_a_version_loads_through_webhdfs_chosen_by_the_config(webhdfs, monkeypatch):
    monkeypatch.setenv("RECSERVE_HDFS_DRIVER", "webhdfs")
    keys = np.array([3, 1, 2], dtype=np.int64)
    values = np.arange(6, dtype=np.float32).reshape(3, 2)
    write_checkpoint(webhdfs.root / "ckpt", {"user": (keys, values)}, global_step=5)
    config = parse_config({"model_store_type": "hdfs", "savedmodel_dir": f"{webhdfs.url}/model",
                           "checkpoint_dir": f"{webhdfs.url}/ckpt"})
    storage = storage_for(config)
    assert isinstance(storage, WebHdfsStorage)
    ref, manifest = newest_complete_version(storage, config.checkpoint_dir, log=logging.getLogger("t"))
    checkpoint = load_checkpoint(storage, ref, manifest)
    np.testing.assert_array_equal(checkpoint.tables["user"].keys, keys)
    np.testing.assert_array_equal(checkpoint.tables["user"].values, values)


def test_unreachable_namenode_is_a_storage_error(webhdfs):
    url = webhdfs.url
    webhdfs.stop()
    with pytest.raises(StorageError, match=rf"^cannot stat {url}/ckpt: namenode unreachable \(ConnectionError"):
        WebHdfsStorage(timeout=2).list(f"{url}/ckpt")


def test_driver_choice(monkeypatch):
    # No JVM here: auto falls back to WebHDFS, an explicit libhdfs fails with the reason.
    assert isinstance(hdfs_storage("hdfs://nn:9870/x", env={}), WebHdfsStorage)
    with pytest.raises(StorageError, match=r"^cannot connect to HDFS nn:8020 through libhdfs: OSError: (Unable to load|Prior attempt to load) libhdfs"):
        pytest.importorskip("pyarrow")
        hdfs_storage("hdfs://nn/x", env={"RECSERVE_HDFS_DRIVER": "libhdfs"})
    with pytest.raises(StorageError, match=r"RECSERVE_HDFS_DRIVER is 'nfs'; valid values are \['webhdfs', 'libhdfs'\]"):
        hdfs_storage("hdfs://nn/x", env={"RECSERVE_HDFS_DRIVER": "nfs"})
    assert split_hdfs_url("hdfs://nn:8020/a/b") == ("nn", 8020, "/a/b")
    with pytest.raises(StorageError, match="expected hdfs://namenode"):
        split_hdfs_url("oss://b/a")
