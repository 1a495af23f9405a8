"""The OSS/S3 backend against moto's S3 API server over HTTP (a real subprocess)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recserve.config import parse_config
from recserve.errors import StorageError
from recserve.export import write_checkpoint, write_delta
from recserve.model_store import (
    LocalStorage,
    list_deltas,
    load_checkpoint,
    newest_complete_version,
    read_manifest,
)
from recserve.model_store.backends import copy_to_local, storage_for
from recserve.model_store.oss import ObjectStorage, oss_region, split_url


def _tree(root: Path) -> None:
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "deep.bin").write_bytes(bytes(range(256)) * 40)
    (root / "a" / "x.txt").write_bytes(b"hello")
    (root / "empty.bin").write_bytes(b"")
    (root / "top.txt").write_bytes(b"0123456789")


@pytest.fixture
def storage(moto_s3) -> ObjectStorage:  # type: ignore[no-untyped-def]
    return moto_s3.storage()


@pytest.mark.parametrize("scheme", ["oss", "s3"])
def test_object_storage_reads_like_local_storage(tmp_path, moto_s3, s3_bucket, storage, scheme):
    _tree(tmp_path / "t")
    moto_s3.upload(tmp_path / "t", s3_bucket, "models/t")
    local, base = LocalStorage(), f"{scheme}://{s3_bucket}/models/t"
    for rel in ["", "a", "a/b", "missing"]:
        lp, rp = str(tmp_path / "t" / rel).rstrip("/"), f"{base}/{rel}".rstrip("/")
        assert storage.list(rp) == local.list(lp)
        assert storage.is_dir(rp) == local.is_dir(lp)
        assert storage.size(rp) == local.size(lp)
    for rel in ["a/b/deep.bin", "a/x.txt", "empty.bin", "top.txt"]:
        lp, rp = str(tmp_path / "t" / rel), f"{base}/{rel}"
        assert storage.size(rp) == local.size(lp)
        assert storage.read(rp) == local.read(lp)
        for start, length in [(0, 3), (5, 100), (10, 5), (9000, 10), (3, 0)]:
            assert storage.read_range(rp, start, length) == local.read_range(lp, start, length)
    assert storage.list(f"{scheme}://{s3_bucket}") == ["models"]
    assert storage.local_path(f"{base}/top.txt") is None


def test_versions_and_checkpoints_load_through_object_storage(tmp_path, moto_s3, s3_bucket, storage):
    keys = np.arange(1, 6, dtype=np.int64)
    values = np.arange(20, dtype=np.float32).reshape(5, 4)
    v = write_checkpoint(tmp_path / "ckpt", {"item": (keys, values)}, global_step=7)
    write_delta(v, {"item": (keys[:2], values[:2] + 1)}, global_step=8)
    moto_s3.upload(tmp_path / "ckpt", s3_bucket, "ckpt")
    url = f"oss://{s3_bucket}/ckpt"
    ref, manifest = newest_complete_version(storage, url, log=__import__("logging").getLogger("t"))
    assert (ref.name, ref.global_step, ref.path) == ("7", 7, f"{url}/7")
    checkpoint = load_checkpoint(storage, ref, manifest)
    np.testing.assert_array_equal(checkpoint.tables["item"].values, values)
    (delta,) = list_deltas(storage, ref.path, 7)
    assert delta.global_step == 8
    assert read_manifest(storage, delta.path).kind == "delta"


def test_unreachable_endpoint_is_a_storage_error_without_secrets():
    dead = ObjectStorage(endpoint="http://127.0.0.1:9", access_id="AKIDSECRETID", access_key="verysecretkey",
                         connect_timeout=0.5)
    with pytest.raises(StorageError) as info:
        dead.list("oss://bucket/ckpt")
    message = str(info.value)
    assert message.startswith("cannot list oss://bucket/ckpt at http://127.0.0.1:9: EndpointConnectionError")
    assert "SECRET" not in message and "secret" not in message


def test_reading_a_missing_object_and_a_missing_bucket(moto_s3, s3_bucket, storage):
    with pytest.raises(StorageError, match=rf"^cannot read oss://{s3_bucket}/nope: no such object$"):
        storage.read(f"oss://{s3_bucket}/nope")
    assert storage.list("oss://no-such-bucket-here/x") == []
    assert storage.size("oss://no-such-bucket-here/x") is None


def test_bad_url_and_region_parsing():
    assert split_url("oss://b/a/b/") == ("b", "a/b/")
    with pytest.raises(StorageError, match="expected oss://bucket/path or s3://bucket/path"):
        split_url("/local/path")
    assert oss_region("https://s3.oss-cn-hangzhou.aliyuncs.com") == "cn-hangzhou"
    assert oss_region("oss-cn-beijing-internal.aliyuncs.com") == "cn-beijing"
    assert oss_region("http://127.0.0.1:9000") is None


def test_storage_for_builds_the_backend_from_the_config(tmp_path, moto_s3, s3_bucket):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model.onnx").write_bytes(b"graph bytes")
    (tmp_path / "model" / "sub").mkdir()
    (tmp_path / "model" / "sub" / "w.bin").write_bytes(b"w" * 100)
    moto_s3.upload(tmp_path / "model", s3_bucket, "model")
    config = parse_config({"model_store_type": "oss", "savedmodel_dir": f"oss://{s3_bucket}/model",
                           "checkpoint_dir": f"oss://{s3_bucket}/ckpt", **moto_s3.config_fields()})
    storage = storage_for(config)
    assert isinstance(storage, ObjectStorage)
    local = Path(copy_to_local(storage, config.savedmodel_dir, str(tmp_path)))
    assert (local / "model.onnx").read_bytes() == b"graph bytes"
    assert (local / "sub" / "w.bin").read_bytes() == b"w" * 100
    assert isinstance(storage_for(parse_config({"savedmodel_dir": str(tmp_path)})), LocalStorage)


def test_s3_store_without_keys_uses_the_aws_credential_chain(monkeypatch, moto_s3, s3_bucket, tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    moto_s3.upload(tmp_path, s3_bucket, "p")
    fields = moto_s3.config_fields()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", fields["oss_access_id"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", fields["oss_access_key"])
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    config = parse_config({"model_store_type": "s3", "savedmodel_dir": f"s3://{s3_bucket}/p",
                           "oss_endpoint": moto_s3.endpoint})
    assert storage_for(config).read(f"s3://{s3_bucket}/p/f") == b"x"


def test_an_object_cut_short_is_a_storage_error(tmp_path, moto_s3, s3_bucket):
    # Found by the chaos soak: a body that ends before its Content-Length raised an
    # AttributeError from the error handling, not a StorageError the updater retries on.
    from benchmarks.fault_proxy import FaultProxy
    from tests.model_store.conftest import S3_ACCESS_ID, S3_ACCESS_KEY

    (tmp_path / "obj.bin").write_bytes(bytes(range(256)) * 8)
    moto_s3.upload(tmp_path, s3_bucket, "cut")
    proxy = FaultProxy(moto_s3.endpoint)
    try:
        through = ObjectStorage(endpoint=proxy.url, access_id=S3_ACCESS_ID, access_key=S3_ACCESS_KEY)
        assert through.read(f"oss://{s3_bucket}/cut/obj.bin") == bytes(range(256)) * 8
        proxy.mode = "truncate"
        for read in (lambda: through.read(f"oss://{s3_bucket}/cut/obj.bin"),
                     lambda: through.read_range(f"oss://{s3_bucket}/cut/obj.bin", 10, 1000)):
            with pytest.raises(StorageError, match=rf"^cannot read oss://{s3_bucket}/cut/obj.bin at {proxy.url}: "
                                                   "ResponseStreamingError: "):
                read()
    finally:
        proxy.close()
