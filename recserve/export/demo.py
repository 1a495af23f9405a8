"""The demo model: a small wide-and-deep CTR model, ready to serve (`recserve demo`).

Layout written under `out_dir`:

    model/            savedmodel_dir: model.onnx + model.json
    checkpoints/1/    a full version: five embedding tables and dense.safetensors
    config.json       DeepRec-style processor config with absolute paths
    warm_up.bin       one serialized tensorflow.eas PredictRequest

Features: user_id and item_id (single ids), clicked_items ([B, L] ids padded with -1,
mean-pooled), city (strings, hashed), query_category and item_category (sharing the table
"category"), and dense age, price, hour ([B, 1] float32 each). Output alias
"probabilities" ([B, 1], graph output "prob") and "logits" (graph output "logit").
Everything derives from fixed seeds, so tests may rely on exact values.
"""

from __future__ import annotations

import functools
import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from recserve.export.checkpoint_writer import PADDING_KEY, write_checkpoint
from recserve.export.model_dir_writer import write_model_dir
from recserve.export.string_key import string_keys
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec, SignatureSpec
from recserve.model_store.checkpoint import TableData
from recserve.wire.codec import encode_request

__all__ = ["DEMO_SPEC", "DemoModel", "demo_tables", "write_demo"]

DIM = 8
HISTORY_LEN = 5
DENSE_FEATURES = ("age", "price", "hour")
GLOBAL_STEP = 1
OPSET = 17
IR_VERSION = 9  # onnxruntime 1.31 rejects the IR version onnx 1.23 writes by default

DEMO_SPEC = ModelSpec(
    embeddings=(
        EmbeddingBinding("user_id", "user", DIM, "user_emb",
                         default=DefaultSpec(kind="normal", stddev=0.1, seed=7)),
        EmbeddingBinding("item_id", "item", DIM, "item_emb"),
        EmbeddingBinding("clicked_items", "item_history", DIM, "clicked_items_emb",
                         combiner="mean"),
        EmbeddingBinding("city", "city", DIM, "city_emb", key_dtype="string"),
        EmbeddingBinding("query_category", "category", DIM, "query_category_emb"),
        EmbeddingBinding("item_category", "category", DIM, "item_category_emb"),
    ),
    signatures={
        "serving_default": SignatureSpec(
            inputs={name: name for name in (
                "user_id", "item_id", "clicked_items", "city",
                "query_category", "item_category", *DENSE_FEATURES)},
            outputs={"probabilities": "prob", "logits": "logit"},
        )
    },
)
CITIES = tuple(f"city_{i:03d}" for i in range(40)) + ("beijing", "hangzhou", "shanghai")
UNKNOWN_CITIES = ("atlantis", "el dorado")
_CONCAT_WIDTH = DIM * len(DEMO_SPEC.embeddings) + len(DENSE_FEATURES)
_HIDDEN = (32, 16)


@functools.cache
def demo_tables() -> dict[str, TableData]:
    """The demo's embedding tables (seed 20240601); keys are non-contiguous."""
    rng = np.random.default_rng(20240601)

    def table(keys: np.ndarray, scale: float) -> TableData:
        values = rng.normal(0.0, scale, (len(keys), DIM)).astype(np.float32)
        return TableData(keys=keys.astype(np.int64), values=values)

    item_keys = rng.choice(10_000_000, 4000, replace=False) + 1
    return {
        "user": table(rng.choice(1_000_000, 3000, replace=False) + 1, 0.5),
        "item": table(item_keys, 0.5),
        "item_history": table(item_keys[rng.permutation(4000)[:2500]], 0.5),
        "city": table(string_keys(CITIES), 0.5),
        "category": table(np.sort(rng.choice(5000, 60, replace=False)) * 3 + 11, 0.5),
    }


@functools.cache
def _graph_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20240602)
    sizes = (_CONCAT_WIDTH, *_HIDDEN, 1)
    weights = {  # feature normalization of age, price, hour
        "dense_mean": np.array([44.0, 40.0, 11.5], dtype=np.float32),
        "dense_std": np.array([15.0, 28.0, 7.0], dtype=np.float32),
    }
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(sizes), start=1):
        weights[f"deep_w{i}"] = rng.normal(0, fan_in**-0.5, (fan_in, fan_out)).astype(np.float32)
        weights[f"deep_b{i}"] = rng.normal(0, 0.1, (fan_out,)).astype(np.float32)
    weights["wide_w"] = rng.normal(0, _CONCAT_WIDTH**-0.5, (_CONCAT_WIDTH, 1)).astype(np.float32)
    weights["wide_b"] = np.array([-0.2], dtype=np.float32)
    return weights


@functools.cache
def demo_dense() -> dict[str, np.ndarray]:
    """dense.safetensors of the demo version: a retrained last layer that overrides the
    graph's `deep_w3` initializer (so serving it exercises the override rule)."""
    rng = np.random.default_rng(20240603)
    return {"deep_w3": rng.normal(0, 0.5, (_HIDDEN[-1], 1)).astype(np.float32)}


def demo_graph() -> onnx.ModelProto:
    emb_inputs = [b.graph_input for b in DEMO_SPEC.embeddings]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", DIM])
              for n in emb_inputs]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 1])
               for n in DENSE_FEATURES]
    nodes = [
        helper.make_node("Concat", list(DENSE_FEATURES), ["dense_raw"], axis=1),
        helper.make_node("Sub", ["dense_raw", "dense_mean"], ["dense_centered"]),
        helper.make_node("Div", ["dense_centered", "dense_std"], ["dense_norm"]),
        helper.make_node("Concat", [*emb_inputs, "dense_norm"], ["features"], axis=1),
    ]
    layer = "features"
    for i in range(1, len(_HIDDEN) + 2):
        nodes += [helper.make_node("MatMul", [layer, f"deep_w{i}"], [f"deep_mm{i}"]),
                  helper.make_node("Add", [f"deep_mm{i}", f"deep_b{i}"], [f"deep_pre{i}"])]
        layer = f"deep_pre{i}"
        if i <= len(_HIDDEN):
            nodes.append(helper.make_node("Relu", [layer], [f"deep_h{i}"]))
            layer = f"deep_h{i}"
    nodes += [
        helper.make_node("MatMul", ["features", "wide_w"], ["wide_mm"]),
        helper.make_node("Add", ["wide_mm", "wide_b"], ["wide_logit"]),
        helper.make_node("Add", [layer, "wide_logit"], ["logit"]),
        helper.make_node("Sigmoid", ["logit"], ["prob"]),
    ]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 1])
               for n in ("prob", "logit")]
    initializers = [numpy_helper.from_array(v, name) for name, v in _graph_weights().items()]
    graph = helper.make_graph(nodes, "recserve_demo_wide_and_deep", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="recserve.export.demo")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


@dataclass(frozen=True)
class DemoModel:
    """Paths of a written demo model, and request inputs that fit it. Immutable."""

    root: Path

    @property
    def model_dir(self) -> Path:
        return self.root / "model"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    @property
    def version_dir(self) -> Path:
        return self.checkpoint_dir / str(GLOBAL_STEP)

    @property
    def config_path(self) -> Path:
        return self.root / "config.json"

    @property
    def warmup_path(self) -> Path:
        return self.root / "warm_up.bin"

    @property
    def spec(self) -> ModelSpec:
        return DEMO_SPEC

    def config(self) -> dict[str, object]:
        return {
            "model_store_type": "local",
            "checkpoint_dir": str(self.checkpoint_dir),
            "savedmodel_dir": str(self.model_dir),
            "warmup_file_name": str(self.warmup_path),
            "signature_name": "serving_default",
            "session_num": 1,
            "select_session_policy": "MOD",
            "feature_store_type": "memory",
            "omp_num_threads": 1,
            "inter_op_parallelism_threads": 1,
            "intra_op_parallelism_threads": 1,
        }

    def sample_inputs(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Valid request inputs keyed by signature alias: about a fifth of the ids are
        unknown keys, clicked_items rows hold 0..5 ids padded with -1, city strings (bytes)
        include unknown cities and the empty (padding) string."""
        tables = demo_tables()

        def ids(table: str, shape: tuple[int, ...]) -> np.ndarray:
            known = rng.choice(tables[table].keys, shape)
            unknown = rng.integers(20_000_000, 30_000_000, shape, dtype=np.int64)
            return np.where(rng.random(shape) < 0.8, known, unknown).astype(np.int64)

        clicked = ids("item_history", (batch, HISTORY_LEN))
        lengths = rng.integers(0, HISTORY_LEN + 1, batch)
        clicked[np.arange(HISTORY_LEN)[None, :] >= lengths[:, None]] = PADDING_KEY
        choices = [c.encode() for c in CITIES + UNKNOWN_CITIES] + [b""]
        city = np.array([choices[i] for i in rng.integers(0, len(choices), batch)], dtype=object)
        dense = {
            "age": rng.integers(18, 70, (batch, 1)).astype(np.float32),
            "price": rng.gamma(2.0, 20.0, (batch, 1)).astype(np.float32),
            "hour": rng.integers(0, 24, (batch, 1)).astype(np.float32),
        }
        return {
            "user_id": ids("user", (batch,)),
            "item_id": ids("item", (batch,)),
            "clicked_items": clicked,
            "city": city,
            "query_category": ids("category", (batch,)),
            "item_category": ids("category", (batch,)),
            **dense,
        }


def write_demo(out_dir: str | os.PathLike[str]) -> DemoModel:
    """Write the demo model, its first version, config.json and warm_up.bin into `out_dir`
    (created if absent; its model/ and checkpoints/1/ must not exist yet)."""
    demo = DemoModel(Path(out_dir).resolve())
    demo.root.mkdir(parents=True, exist_ok=True)
    write_model_dir(demo.model_dir, demo_graph(), DEMO_SPEC)
    write_checkpoint(demo.checkpoint_dir, demo_tables(), global_step=GLOBAL_STEP,
                     dense=demo_dense())
    warmup = demo.sample_inputs(8, np.random.default_rng(20240604))
    demo.warmup_path.write_bytes(encode_request(warmup))
    demo.config_path.write_text(json.dumps(demo.config(), indent=2) + "\n", encoding="utf-8")
    return demo
