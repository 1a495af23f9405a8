"""Fixtures of the model store tests: real servers for the remote storage backends, each a
subprocess on a free port — moto's S3 API server (standing in for OSS/S3) and a
WebHDFS-protocol stand-in (webhdfs_standin.py; no real HDFS can run here) — and a tiny
model whose outputs identify the parameters that produced them."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.export import TableData, write_checkpoint, write_delta, write_model_dir
from recserve.model_spec import EmbeddingBinding, ModelSpec
from recserve.model_store.oss import ObjectStorage

HERE = Path(__file__).resolve().parent
# moto accepts any credentials; these are what the tests configure.
S3_ACCESS_ID = "testing-id"
S3_ACCESS_KEY = "testing-key"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_listening(port: int, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not listen on port {port} within 30 s")


class ServerProcess:
    """A server subprocess that can be stopped and started again on the same port."""

    def __init__(self, argv: list[str], port: int, what: str) -> None:
        self.argv, self.port, self.what = argv, port, what
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_listening(self.port, self.process, self.what)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(10)
        self.process = None


class MotoS3(ServerProcess):
    def __init__(self, port: int) -> None:
        super().__init__([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], port, "moto server")
        self.endpoint = f"http://127.0.0.1:{port}"

    def client(self):  # type: ignore[no-untyped-def]
        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_ACCESS_ID,
                            aws_secret_access_key=S3_ACCESS_KEY, region_name="us-east-1")

    def config_fields(self) -> dict[str, str]:
        return {"oss_endpoint": self.endpoint, "oss_access_id": S3_ACCESS_ID, "oss_access_key": S3_ACCESS_KEY}

    def storage(self, **kwargs: float) -> ObjectStorage:
        return ObjectStorage(endpoint=self.endpoint, access_id=S3_ACCESS_ID, access_key=S3_ACCESS_KEY, **kwargs)

    def upload(self, local: Path, bucket: str, prefix: str) -> None:
        """Upload `local` under `prefix`, every MANIFEST.json last (deepest first): the
        order in which a trainer publishes a version to an object store."""
        client = self.client()
        files = sorted(p for p in local.rglob("*") if p.is_file())
        manifests = sorted((p for p in files if p.name == "MANIFEST.json"), key=lambda p: -len(p.parts))
        for path in [p for p in files if p.name != "MANIFEST.json"] + manifests:
            key = f"{prefix.rstrip('/')}/{path.relative_to(local).as_posix()}"
            client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())


class WebHdfs(ServerProcess):
    def __init__(self, root: Path, port: int) -> None:
        super().__init__([sys.executable, str(HERE / "webhdfs_standin.py"), "--root", str(root), "--port", str(port)],
                         port, "WebHDFS stand-in")
        self.root = root
        self.url = f"hdfs://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    server = MotoS3(free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def s3_bucket(moto_s3: MotoS3) -> str:
    bucket = f"recserve-{uuid.uuid4().hex[:12]}"
    moto_s3.client().create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def webhdfs(tmp_path: Path) -> Iterator[WebHdfs]:
    root = tmp_path / "hdfs-root"
    root.mkdir()
    server = WebHdfs(root, free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def _no_aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's own AWS settings must not leak into the tests.
    for name in list(os.environ):
        if name.startswith(("AWS_", "RECSERVE_HDFS")) or name == "RECSERVE_WEBHDFS_URL":
            monkeypatch.delenv(name, raising=False)


# -- a tiny servable model whose outputs identify the parameters that produced them ----------

DIM = 4


@dataclass
class TinyModel:
    """Model `score = emb(item_id) * w`: table "item" (dim 4) and dense `w`. Row of key k
    under tag t is [t, k, t + k, 1]; full versions set w; all values are exact in float32,
    so an output names the one (tag, w) that produced it."""

    root: Path
    keys: np.ndarray

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "ckpt"

    def rows(self, tag: float, keys: np.ndarray | None = None) -> np.ndarray:
        k = (self.keys if keys is None else keys).astype(np.float32)
        return np.stack([np.full_like(k, tag), k, tag + k, np.ones_like(k)], axis=1).astype(np.float32)

    def expected(self, keys: np.ndarray, tag: float, w: float) -> np.ndarray:
        return self.rows(tag, keys) * np.float32(w)

    def write_full(self, step: int, tag: float, w: float, *, name: str | None = None, root: Path | None = None) -> Path:
        return write_checkpoint(root or self.checkpoint_dir, {"item": (self.keys, self.rows(tag))}, global_step=step,
                                name=name, dense={"w": np.full(DIM, w, np.float32)})

    def write_delta(self, version_dir: Path, step: int, tag: float, *, keys: np.ndarray | None = None,
                    deleted: np.ndarray | None = None) -> Path:
        keys = self.keys if keys is None else keys
        data = TableData(keys=keys, values=self.rows(tag, keys), deleted=deleted)
        return write_delta(version_dir, {"item": data}, global_step=step)

    def config(self, **extra: object) -> dict[str, object]:
        return {"savedmodel_dir": str(self.model_dir), "checkpoint_dir": str(self.checkpoint_dir),
                "session_num": 2, "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1, **extra}


def _tiny_graph() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Mul", ["emb", "w"], ["score"])], "tiny",
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["batch", DIM])],
        [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["batch", DIM])],
        [numpy_helper.from_array(np.ones(DIM, np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


@pytest.fixture
def tiny(tmp_path: Path) -> TinyModel:
    model = TinyModel(tmp_path, np.arange(1, 65, dtype=np.int64) * 7)
    spec = ModelSpec(embeddings=(EmbeddingBinding(input="item_id", table="item", dim=DIM, graph_input="emb"),))
    write_model_dir(model.model_dir, _tiny_graph(), spec)
    return model
