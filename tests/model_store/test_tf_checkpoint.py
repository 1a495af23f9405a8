"""DeepRec / TensorFlow checkpoints served as they are (DESIGN §4b), written by real
TensorFlow (tf.raw_ops.SaveV2 / MergeV2Checkpoints, in a process of its own: tf_writer.py;
exactly the bundles DeepRec writes, Embedding Variables being tensors named `E-keys`,
`E-values`, ...): predictions equal a numpy + onnxruntime reference, incremental bundles
update rows in place, corrupt or incomplete bundles are refused with the tensor's name while
the serving version stays."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve import Processor
from recserve.errors import CorruptVersionError
from recserve.export import write_model_dir
from recserve.model_spec import EmbeddingBinding, ModelSpec
from recserve.model_store.tensor_bundle import TensorBundle

if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("TensorFlow (the test extra: make test installs it) writes the checkpoints", allow_module_level=True)

DIM = 4
rng = np.random.default_rng(11)


_writer: list[subprocess.Popen[str]] = []


@pytest.fixture(scope="module", autouse=True)
def tf_writer() -> Iterator[None]:
    process = subprocess.Popen([sys.executable, str(Path(__file__).with_name("tf_writer.py"))], text=True,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    _writer.append(process)
    yield
    _writer.clear()
    process.stdin.close()  # type: ignore[union-attr]
    process.wait(30)


def save_bundle(prefix: Path, tensors: dict[str, np.ndarray], shards: int = 1,
                slices: dict[str, str] | None = None) -> None:
    """What TensorFlow's Saver writes: SaveV2 per shard, merged into one bundle."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(suffix=".npz", delete=False) as f:
        np.savez(f, **{name.replace("/", "|"): value for name, value in tensors.items()})
    try:
        process = _writer[0]
        process.stdin.write(json.dumps({"prefix": str(prefix), "npz": f.name, "shards": shards, "slices": slices or {}}) + "\n")  # type: ignore[union-attr]
        process.stdin.flush()  # type: ignore[union-attr]
        answer = process.stdout.readline().strip()  # type: ignore[union-attr]
    finally:
        os.unlink(f.name)
    assert answer == "ok", answer or "the TensorFlow writer died"


def write_state(version_dir: Path, prefix: str) -> None:
    (version_dir / "checkpoint").write_text(
        f'model_checkpoint_path: "{prefix}"\nall_model_checkpoint_paths: "{prefix}"\n')


def ev(name: str, keys: np.ndarray, values: np.ndarray, *, freqs: bool = True) -> dict[str, np.ndarray]:
    out = {f"{name}-keys": keys.astype(np.int64), f"{name}-values": values.astype(np.float32)}
    if freqs:
        out[f"{name}-freqs"] = np.ones(len(keys), np.int64)
        out[f"{name}-versions"] = np.full(len(keys), 7, np.int64)
    return out


def model(root: Path) -> Path:
    """user and item embeddings -> concat -> MatMul W -> sigmoid; W comes from the checkpoint."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["u", "i"], ["x"], axis=1), helper.make_node("MatMul", ["x", "W"], ["y"]),
         helper.make_node("Sigmoid", ["y"], ["p"])], "m",
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, ["b", DIM]),
         helper.make_tensor_value_info("i", TensorProto.FLOAT, ["b", DIM])],
        [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["b", 1])],
        [numpy_helper.from_array(np.zeros((2 * DIM, 1), np.float32), "W")])
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    spec = ModelSpec(embeddings=(EmbeddingBinding(input="user", table="user", dim=DIM, graph_input="u"),
                                 EmbeddingBinding(input="item", table="item", dim=DIM, graph_input="i")),
                     checkpoint_names={"user": "input_layer/user_emb/embedding_weights", "item": "item_emb",
                                       "W": "dnn/kernel"})
    return Path(write_model_dir(root / "model", onnx_model, spec))


class Tree:
    """A DeepRec checkpoint_dir: version directories, each a checkpoint state + bundles."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.user_keys = np.arange(100, 160, dtype=np.int64)
        self.user = rng.standard_normal((60, DIM)).astype(np.float32)
        self.item_keys = np.arange(1000, 1080, dtype=np.int64)
        self.item = rng.standard_normal((80, DIM)).astype(np.float32)
        self.kernel = rng.standard_normal((2 * DIM, 1)).astype(np.float32)

    def full(self, name: str, step: int) -> Path:
        tensors = {**ev("input_layer/user_emb/embedding_weights", self.user_keys, self.user),
                   # Optimizer slots and filtered ids: never served.
                   **ev("input_layer/user_emb/embedding_weights/Adagrad", self.user_keys, self.user * 0 + 9),
                   "input_layer/user_emb/embedding_weights-keys_filtered": np.array([5, 6], np.int64),
                   "dnn/kernel": self.kernel, "dnn/kernel/Adagrad": self.kernel * 0 + 3,
                   "global_step": np.array(step, np.int64), "vocab": np.array([b"a", b"bc"], dtype="S2"),
                   **ev("empty_emb", np.zeros(0, np.int64), np.zeros((0, DIM), np.float32))}
        for k in range(4):  # item_emb partitioned into 4 by key modulo
            mine = self.item_keys % 4 == k
            tensors.update(ev(f"item_emb/part_{k}", self.item_keys[mine], self.item[mine], freqs=False))
            tensors.update(ev(f"item_emb/part_{k}/Adam", self.item_keys[mine], self.item[mine] * 0 - 1, freqs=False))
        version = self.root / name
        save_bundle(version / f"model.ckpt-{step}", tensors, shards=2)
        write_state(version, f"model.ckpt-{step}")
        return version

    def reference(self, user_ids: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
        def rows(keys: np.ndarray, values: np.ndarray, ids: np.ndarray) -> np.ndarray:
            table = dict(zip(keys.tolist(), values))
            return np.stack([table.get(i, np.zeros(DIM, np.float32)) for i in ids.tolist()])

        x = np.concatenate([rows(self.user_keys, self.user, user_ids), rows(self.item_keys, self.item, item_ids)], 1)
        graph = onnx.load(str(self.model_dir / "model.onnx"))
        graph.graph.initializer[0].CopyFrom(numpy_helper.from_array(self.kernel, "W"))
        session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, {"u": x[:, :DIM], "i": x[:, DIM:]})[0]


@pytest.fixture
def tree(tmp_path: Path) -> Tree:
    t = Tree(tmp_path / "ckpt")
    t.model_dir = model(tmp_path)  # type: ignore[attr-defined]
    t.full("v1", 100)
    return t


def config(tree: Tree) -> dict[str, object]:
    return {"model_store_type": "local", "savedmodel_dir": str(tree.model_dir),  # type: ignore[attr-defined]
            "checkpoint_dir": str(tree.root), "model_update_interval_seconds": 0.1}


def ids() -> tuple[np.ndarray, np.ndarray]:
    return np.array([100, 130, 159, 5, 999], np.int64), np.array([1000, 1041, 1079, 1082, 7], np.int64)


def wait_until(check, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_deeprec_tree_serves_like_the_reference(tree):
    processor = Processor(config(tree))
    try:
        info = processor.model_info()
        assert (info["version"], info["global_step"]) == ("v1", 100)
        assert info["tables"] == {"user": {"rows": 60}, "item": {"rows": 80}}
        user_ids, item_ids = ids()
        got = processor.predict({"user": user_ids, "item": item_ids})["p"]
        np.testing.assert_allclose(got, tree.reference(user_ids, item_ids), atol=1e-5)
    finally:
        processor.close()


def test_incremental_bundle_updates_rows_in_place(tree):
    processor = Processor(config(tree))
    try:
        changed = tree.user_keys[:10]
        tree.user[:10] += 1.0
        new_keys = np.array([200, 201], np.int64)
        new_rows = rng.standard_normal((2, DIM)).astype(np.float32)
        part2 = tree.item_keys[tree.item_keys % 4 == 2][:3]
        tree.item[np.isin(tree.item_keys, part2)] *= -1
        incremental = {
            "input_layer/user_emb/embedding_weights-sparse_incr_keys": np.concatenate([changed, new_keys]),
            "input_layer/user_emb/embedding_weights-sparse_incr_values": np.concatenate([tree.user[:10], new_rows]),
            "item_emb/part_2-sparse_incr_keys": part2,
            "item_emb/part_2-sparse_incr_values": tree.item[np.isin(tree.item_keys, part2)],
        }
        save_bundle(tree.root / "v1" / ".incremental_checkpoint" / "model.ckpt-150", incremental)
        tree.user_keys = np.concatenate([tree.user_keys, new_keys])
        tree.user = np.concatenate([tree.user, new_rows])
        user_ids, item_ids = np.array([100, 105, 200, 201, 150]), np.array(part2.tolist() + [1000, 1001])
        want = tree.reference(user_ids, item_ids)
        wait_until(lambda: processor.model_info()["delta_step"] == 150)
        np.testing.assert_allclose(processor.predict({"user": user_ids, "item": item_ids})["p"], want, atol=1e-5)
        assert processor.model_info()["tables"]["user"] == {"rows": 62}
    finally:
        processor.close()


def test_corrupt_newer_version_is_refused_naming_the_tensor(tree):
    processor = Processor(config(tree))
    try:
        version = tree.full("v2", 200)
        bundle = TensorBundle(str(version / "model.ckpt-200"))
        entry = bundle.entries["input_layer/user_emb/embedding_weights-values"]
        bundle.close()
        shard = version / f"model.ckpt-200.data-{entry.shard:05d}-of-00002"
        data = bytearray(shard.read_bytes())
        data[entry.offset + 5] ^= 0x40
        shard.write_bytes(bytes(data))
        wait_until(lambda: processor.model_info()["last_error"] is not None)
        error = processor.model_info()["last_error"]
        assert "tensor 'input_layer/user_emb/embedding_weights-values' fails its crc32c check" in error, error
        assert processor.model_info()["version"] == "v1"
    finally:
        processor.close()


def test_bundle_problems_are_named(tree, tmp_path):
    prefix = tree.root / "v1" / "model.ckpt-100"
    bundle = TensorBundle(str(prefix))
    assert bundle.read("vocab").tolist() == [b"a", b"bc"]
    assert bundle.read("global_step") == 100
    assert bundle.read("empty_emb-values").shape == (0, DIM)
    bundle.close()
    # A truncated shard names the tensor that no longer fits.
    copy = tmp_path / "copy"
    shutil.copytree(tree.root / "v1", copy)
    shard = copy / "model.ckpt-100.data-00001-of-00002"
    shard.write_bytes(shard.read_bytes()[:40])
    bundle = TensorBundle(str(copy / "model.ckpt-100"))
    late = max((e for e in bundle.entries.values() if e.shard == 1), key=lambda e: e.offset)
    with pytest.raises(CorruptVersionError, match=f"tensor {late.name!r} lies at bytes"):
        bundle.read(late.name)
    # A missing shard.
    bundle.close()
    shard.unlink()
    with pytest.raises(CorruptVersionError, match="cannot read the data shard"):
        TensorBundle(str(copy / "model.ckpt-100")).read(late.name)
    # Any damage to the index is an error, never a crash.
    index = (tree.root / "v1" / "model.ckpt-100.index").read_bytes()
    for position in range(0, len(index), max(1, len(index) // 200)):
        damaged = bytearray(index)
        damaged[position] ^= 0xFF
        (copy / "model.ckpt-100.index").write_bytes(bytes(damaged))
        try:
            TensorBundle(str(copy / "model.ckpt-100"))
        except CorruptVersionError:
            pass


def test_incomplete_and_mixed_versions(tree):
    import logging

    from recserve.errors import ModelLoadError
    from recserve.model_store.storage import LocalStorage
    from recserve.model_store.versions import newest_complete_version

    def newest() -> str:
        return newest_complete_version(LocalStorage(), str(tree.root), log=logging.getLogger("t"))[0].name

    tree.full("v2", 200)
    assert newest() == "v2"
    write_state(tree.root / "v2", "model.ckpt-300")  # names a prefix with no .index: not ready
    (tree.root / "v3").mkdir()
    (tree.root / "v3" / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1"\n')  # nothing saved yet
    assert newest() == "v1"
    (tree.root / "v1" / "MANIFEST.json").write_text("{}")
    with pytest.raises(ModelLoadError) as failure:
        newest()
    assert "names 'model.ckpt-300', which has no .index" in str(failure.value)
    assert "holds both MANIFEST.json (a recserve version) and a TensorFlow 'checkpoint' state file" in str(failure.value)
    os.remove(tree.root / "v1" / "MANIFEST.json")


def test_tables_from_a_tf_checkpoint_in_redis(tree, redis_server):
    processor = Processor({**config(tree), "feature_store_type": "redis", "redis_url": redis_server.url})
    try:
        user_ids, item_ids = ids()
        got = processor.predict({"user": user_ids, "item": item_ids})["p"]
        np.testing.assert_allclose(got, tree.reference(user_ids, item_ids), atol=1e-5)
    finally:
        processor.close()


LOAD_CHILD = r"""
import json, sys, threading, time
from recserve import Processor
def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
before = anon()
peak, samples = [before], [0]
done = threading.Event()
def sample():
    while not done.is_set():
        peak[0] = max(peak[0], anon()); samples[0] += 1; time.sleep(0.001)
sampler = threading.Thread(target=sample, daemon=True)
sampler.start()
p = Processor(json.loads(sys.argv[1]))
done.set()
sampler.join(60)
assert not sampler.is_alive(), "the RssAnon sampler did not stop in 60 s"
print(json.dumps({"before": before, "peak": peak[0], "samples": samples[0], "after": anon(),
                  "rows": p.model_info()["tables"]}))
p.close()
"""


@pytest.mark.skipif(os.environ.get("RECSERVE_PURE_PYTHON") == "1", reason="memory of the native engine")
def test_loading_a_big_ev_copies_its_rows_once(tree, tmp_path):
    """Peak anonymous memory while loading stays within 10% of what the tables hold after."""
    rows = 1_000_000
    keys = np.arange(rows, dtype=np.int64) * 7
    values = rng.standard_normal((rows, DIM * 8)).astype(np.float32)  # 128 MB of rows
    tensors = {**ev("big", keys[: rows // 2], values[: rows // 2]),
               **{f"{k.replace('big', 'big/part_1')}": v for k, v in ev("big", keys[rows // 2:], values[rows // 2:]).items()},
               **ev("small", keys[:10], values[:10, :DIM])}
    # "big" unpartitioned half plus one partition: both paths (a mapped view; a merge).
    version = tmp_path / "bigckpt" / "v1"
    save_bundle(version / "model.ckpt-1", {k.replace("big-", "big/part_0-"): v for k, v in tensors.items()})
    write_state(version, "model.ckpt-1")
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["e", "axes"], ["s"], keepdims=0)], "m",
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, ["b", DIM * 8])],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, ["b"])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")])
    spec = ModelSpec(embeddings=(EmbeddingBinding(input="ids", table="t", dim=DIM * 8, graph_input="e"),),
                     checkpoint_names={"t": "big"})
    model_dir = write_model_dir(tmp_path / "bigmodel", helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), spec)
    config = {"model_store_type": "local", "savedmodel_dir": str(model_dir),
              "checkpoint_dir": str(tmp_path / "bigckpt")}
    done = subprocess.run([sys.executable, "-c", LOAD_CHILD, json.dumps(config)], capture_output=True, text=True,
                          timeout=300, check=False, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["rows"] == {"t": {"rows": rows}}
    assert result["samples"] > 10, result  # the sampler ran while the version loaded
    held = result["after"] - result["before"]
    assert held >= values.nbytes  # the rows are in the table
    assert result["peak"] - result["before"] <= 1.1 * held, result


def test_a_sliced_tensor_is_assembled_from_its_slices(tmp_path):
    """A partitioned plain Variable saved in slices (TF's Saver: one tensor, a slice per
    partition, keyed by EncodeTensorNameSlice): read whole. Row offsets above 8191 take
    3-byte OrderedCode numbers; the slice bounds below cover 1- to 3-byte ones."""
    rows = 70000
    full = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    prefix = tmp_path / "sliced" / "model.ckpt-1"
    save_bundle(prefix, {"w#0": full[:40], "w#1": full[40:9000], "w#2": full[9000:], "ok": np.arange(3)},
                slices={"w#0": f"{rows} 3 0,40:-", "w#1": f"{rows} 3 40,8960:-", "w#2": f"{rows} 3 9000,61000:-"})
    bundle = TensorBundle(str(prefix))
    assert bundle.read("ok").tolist() == [0, 1, 2]
    assert np.array_equal(bundle.read("w"), full)


def test_a_sliced_tensor_missing_a_slice_is_refused_by_name(tmp_path):
    prefix = tmp_path / "sliced" / "model.ckpt-1"
    save_bundle(prefix, {"w": np.ones((2, 2), np.float32)}, slices={"w": "4 2 0,2:-"})
    with pytest.raises(CorruptVersionError, match="slices of tensor 'w' cover 4 of its 8 values"):
        TensorBundle(str(prefix)).read("w")
