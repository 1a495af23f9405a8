"""Models the benchmarks serve, built with recserve's own export API."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from recserve.export import write_checkpoint, write_model_dir
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec, SignatureSpec


@dataclass
class DlrmModel:
    root: Path
    model_dir: Path
    checkpoint_dir: Path
    keys: list[np.ndarray]      # per table
    values: list[np.ndarray]    # per table, [rows, dim] float32
    n_sparse: int
    n_dense: int
    dim: int

    def config(self, **extra: object) -> dict[str, object]:
        return {
            "model_store_type": "local",
            "savedmodel_dir": str(self.model_dir),
            "checkpoint_dir": str(self.checkpoint_dir),
            **extra,
        }

    def sample(self, batch: int, rng: np.random.Generator) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
        """A request's inputs and, per table, the pre-resolved row ids (the floor's input)."""
        inputs: dict[str, np.ndarray] = {"dense": rng.random((batch, self.n_dense), dtype=np.float32)}
        rows = []
        for t in range(self.n_sparse):
            r = rng.integers(0, len(self.keys[t]), batch)
            rows.append(r)
            inputs[f"C{t}"] = self.keys[t][r]
        return inputs, rows


def _mlp(sizes: list[int], rng: np.random.Generator) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    nodes, inits = [], []
    x = "features"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        b = np.zeros(n_out, np.float32)
        inits += [numpy_helper.from_array(w, f"W{i}"), numpy_helper.from_array(b, f"b{i}")]
        y = f"h{i}"
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"b{i}"], [y]))
        if i < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [y], [y + "_relu"]))
            y += "_relu"
        x = y
    nodes.append(helper.make_node("Sigmoid", [x], ["prob"]))
    return nodes, inits


def build_dlrm(
    root: Path, *, n_sparse: int = 26, n_dense: int = 13, dim: int = 16, total_rows: int = 10_000_000,
    hidden: tuple[int, ...] = (512, 256), seed: int = 0,
) -> DlrmModel:
    """26 sparse features (one table each, `total_rows` rows in all), 13 dense, MLP 429-512-256-1."""
    rng = np.random.default_rng(seed)
    inputs = [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", n_dense])]
    inputs += [helper.make_tensor_value_info(f"emb{t}", TensorProto.FLOAT, ["batch", dim]) for t in range(n_sparse)]
    concat = helper.make_node("Concat", ["dense"] + [f"emb{t}" for t in range(n_sparse)], ["features"], axis=1)
    nodes, inits = _mlp([n_dense + n_sparse * dim, *hidden, 1], rng)
    graph = helper.make_graph(
        [concat, *nodes], "dlrm", inputs, [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1])], inits
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    spec = ModelSpec(
        embeddings=tuple(
            EmbeddingBinding(input=f"C{t}", table=f"t{t}", dim=dim, graph_input=f"emb{t}") for t in range(n_sparse)
        )
    )
    model_dir = write_model_dir(root / "model", model, spec)
    per_table = total_rows // n_sparse
    keys, values, tables = [], [], {}
    for t in range(n_sparse):
        # Random 64-bit keys (not 0..N-1) so the hash index does real work.
        k = np.unique(rng.integers(0, np.iinfo(np.int64).max, int(per_table * 1.01) + 16, dtype=np.int64))
        k = rng.permutation(k[:per_table])
        v = rng.standard_normal((per_table, dim), dtype=np.float32)
        keys.append(k)
        values.append(v)
        tables[f"t{t}"] = (k, v)
    checkpoint_dir = root / "checkpoints"
    write_checkpoint(checkpoint_dir, tables, global_step=1)
    return DlrmModel(root, Path(model_dir), checkpoint_dir, keys, values, n_sparse, n_dense, dim)


@dataclass
class PlainDlrmModel:
    """The DLRM-like model as an exporter writes it: one ONNX file, each table a [rows, dim]
    initializer read by a Gather, no model.json (served with device placement)."""

    root: Path
    model_dir: Path
    onnx_path: Path
    rows: int
    n_sparse: int
    n_dense: int

    def config(self, **extra: object) -> dict[str, object]:
        return {"savedmodel_dir": str(self.model_dir), "enable_device_placement_optimization": True, **extra}

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        inputs: dict[str, np.ndarray] = {"dense": rng.random((batch, self.n_dense), dtype=np.float32)}
        for t in range(self.n_sparse):
            inputs[f"C{t}"] = rng.integers(0, self.rows, batch, dtype=np.int64)
        return inputs


def build_plain_dlrm(
    root: Path, *, n_sparse: int = 26, n_dense: int = 13, dim: int = 16, rows: int = 40_000,
    hidden: tuple[int, ...] = (512, 256), seed: int = 0,
) -> PlainDlrmModel:
    """26 Gathers on [rows, dim] initializers + 13 dense features, MLP 429-512-256-1."""
    rng = np.random.default_rng(seed)
    inputs = [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", n_dense])]
    inputs += [helper.make_tensor_value_info(f"C{t}", TensorProto.INT64, ["batch"]) for t in range(n_sparse)]
    gathers = [helper.make_node("Gather", [f"table{t}", f"C{t}"], [f"emb{t}"], axis=0) for t in range(n_sparse)]
    tables = [
        numpy_helper.from_array(rng.standard_normal((rows, dim), dtype=np.float32), f"table{t}") for t in range(n_sparse)
    ]
    concat = helper.make_node("Concat", ["dense"] + [f"emb{t}" for t in range(n_sparse)], ["features"], axis=1)
    nodes, inits = _mlp([n_dense + n_sparse * dim, *hidden, 1], rng)
    graph = helper.make_graph(
        [*gathers, concat, *nodes], "plain_dlrm", inputs,
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1])], [*tables, *inits],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    model_dir = root / "plain_model"
    model_dir.mkdir(parents=True, exist_ok=True)
    onnx_path = model_dir / "model.onnx"
    onnx.save(model, str(onnx_path))
    return PlainDlrmModel(root, model_dir, onnx_path, rows, n_sparse, n_dense)


# Words of the string-keyed model's vocabulary columns: ASCII, CJK, one listed twice (its
# last index is its key, as a Python dict keeps it) and '' (padding whatever the list says).
VOCABULARY = ("sports", "news", "music", "北京", "東京", "café", "news", "", "games", "travel")


@dataclass
class StringKeyedModel:
    """The shape of a TF feature-column model converted from a SavedModel: string ids keyed
    by TensorFlow's hash buckets (farmhash64_mod), by XXH64 and by vocabularies, single- and
    multi-valued (padded with ''), plus dense features into an MLP."""

    root: Path
    model_dir: Path
    checkpoint_dir: Path
    buckets: int
    tag_buckets: int
    items: int
    length: int

    def config(self, **extra: object) -> dict[str, object]:
        return {"savedmodel_dir": str(self.model_dir), "checkpoint_dir": str(self.checkpoint_dir), **extra}

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Known and unknown strings, '' (padding), non-UTF-8 bytes, rows of padding only."""
        def word(pool: list[bytes]) -> bytes:
            roll = rng.random()
            if roll < 0.1:
                return b""
            if roll < 0.15:
                return bytes(rng.integers(128, 256, int(rng.integers(1, 9)), dtype=np.uint8))  # not UTF-8
            if roll < 0.25:
                return f"unknown-{rng.integers(1 << 40)}".encode()
            return pool[int(rng.integers(len(pool)))]

        vocabulary = [w.encode() for w in VOCABULARY if w]
        tags = [f"tag{i}".encode() for i in range(50)] + ["标签".encode(), b"x" * 70]
        users = [f"user-{i}".encode() for i in range(1000)]
        item_pool = [f"item-{i}".encode() for i in range(self.items)]

        def column(pool: list[bytes], shape: tuple[int, ...]) -> np.ndarray:
            out = np.empty(shape, dtype=object)
            for index in np.ndindex(*shape):
                out[index] = word(pool)
            return out

        topics = column(vocabulary, (batch, self.length))
        topics[: batch // 4] = b""   # some rows are padding only
        return {
            "user": column(users, (batch,)),
            "item": column(item_pool, (batch,)),
            "tags": column(tags, (batch, self.length)),
            "genre": column(vocabulary, (batch,)),
            "topics": topics,
            "dense": rng.random((batch, 4), dtype=np.float32),
        }


def build_string_keyed(
    root: Path, *, dim: int = 16, buckets: int = 10_000, tag_buckets: int = 1000, items: int = 5000,
    length: int = 5, hidden: tuple[int, ...] = (64,), seed: int = 0, output_features: bool = False,
    keras: bool = False,
) -> StringKeyedModel:
    """Five string bindings (see StringKeyedModel) over tables whose rows cover only part of
    each key space (the rest get the table's default: zeros, or normal rows for the vocabulary
    tables). `output_features`: also output the MLP's input, where the embeddings can be read.
    `keras`: keyed as a converted Keras model's Hashing and StringLookup layers are ('' a
    string like any other; unknown genres to 3 OOV buckets after the vocabulary, unknown
    topics to id 0)."""
    from recserve.embedding import string_keys

    rng = np.random.default_rng(seed)
    normal = DefaultSpec(kind="normal", stddev=0.5, seed=3)
    bindings = (
        EmbeddingBinding(input="user", table="user_hash", dim=dim, graph_input="e_user", key_dtype="string",
                         buckets=buckets),
        EmbeddingBinding(input="item", table="items", dim=dim, graph_input="e_item", key_dtype="string"),
        EmbeddingBinding(input="tags", table="tag_hash", dim=dim, graph_input="e_tags", key_dtype="string",
                         buckets=tag_buckets, combiner="mean"),
        EmbeddingBinding(input="genre", table="genres", dim=dim, graph_input="e_genre", key_dtype="string",
                         vocabulary=VOCABULARY, default=normal),
        EmbeddingBinding(input="topics", table="genres", dim=dim, graph_input="e_topics", key_dtype="string",
                         vocabulary=VOCABULARY, combiner="sum", default=normal),
    )
    if keras:
        user, item, tags, genre, topics = bindings
        bindings = (replace(user, empty_is_padding=False), item, tags,
                    replace(genre, oov_buckets=3, oov_start=len(VOCABULARY), empty_is_padding=False),
                    replace(topics, default_id=0, vocabulary_start=1))
    parts = ["dense"] + [b.graph_input for b in bindings]
    inputs = [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", 4])]
    inputs += [helper.make_tensor_value_info(b.graph_input, TensorProto.FLOAT, ["batch", dim]) for b in bindings]
    concat = helper.make_node("Concat", parts, ["features"], axis=1)
    nodes, inits = _mlp([4 + len(bindings) * dim, *hidden, 1], rng)
    outputs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1])]
    signature_outputs = {"prob": "prob"}
    if output_features:
        outputs.append(helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 4 + len(bindings) * dim]))
        signature_outputs["features"] = "features"
    graph = helper.make_graph([concat, *nodes], "string_keyed", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    spec = ModelSpec(embeddings=bindings, signatures={"serving_default": SignatureSpec(
        inputs={b.input: b.input for b in bindings} | {"dense": "dense"}, outputs=signature_outputs)})
    model_dir = Path(write_model_dir(root / "string_model", model, spec))

    def rows(n: int) -> np.ndarray:
        return rng.standard_normal((n, dim), dtype=np.float32)

    item_names = np.array([f"item-{i}".encode() for i in range(items)], dtype=object)
    tables = {
        "user_hash": (np.arange(0, buckets, 2, dtype=np.int64), rows(len(range(0, buckets, 2)))),   # even buckets
        "items": (string_keys(item_names), rows(items)),
        "tag_hash": (np.arange(tag_buckets // 2, dtype=np.int64), rows(tag_buckets // 2)),
        "genres": (np.arange(0, len(VOCABULARY), 2, dtype=np.int64), rows(len(range(0, len(VOCABULARY), 2)))),
    }
    checkpoint_dir = root / "string_checkpoints"
    write_checkpoint(checkpoint_dir, tables, global_step=1)
    return StringKeyedModel(root, model_dir, checkpoint_dir, buckets, tag_buckets, items, length)


# The integer-vocabulary model's lists. SHOPS: an id listed twice (its last index is its
# key), a gap (None: a key no id has), -1 (padding whatever the list says), ids past 2**32.
SHOPS = (7, 42, 1 << 33, -5, 42, None, 0, 123_456_789, -1, 9, (1 << 62) + 3)
BRANDS = (3, 1, 4, 15, 92, 65, 35)


@dataclass
class IntVocabularyModel:
    """The shape of a converted SavedModel's integer vocabulary columns (feature columns'
    categorical_column_with_vocabulary_list of ints: -1 padding; unknown ids dropped or to a
    default id) and of a Keras IntegerLookup (-1 an id like any other, listed here; keys from
    1, unknown ids to 0), plus dense features into an MLP."""

    root: Path
    model_dir: Path
    checkpoint_dir: Path
    items: tuple[int, ...]
    length: int

    def config(self, **extra: object) -> dict[str, object]:
        return {"savedmodel_dir": str(self.model_dir), "checkpoint_dir": str(self.checkpoint_dir), **extra}

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Listed ids, -1, and unknown ones: negative, beyond 2**32, int64's extremes."""
        def column(pool: tuple[int | None, ...], shape: tuple[int, ...]) -> np.ndarray:
            known = np.array([i for i in pool if i is not None], dtype=np.int64)
            roll = rng.random(shape)
            out = known[rng.integers(len(known), size=shape)]
            out = np.where(roll < 0.15, -1, out)
            out = np.where((roll >= 0.15) & (roll < 0.2), -rng.integers(2, 1 << 40, size=shape), out)
            out = np.where((roll >= 0.2) & (roll < 0.25), rng.integers(1 << 32, 1 << 62, size=shape), out)
            out = np.where((roll >= 0.25) & (roll < 0.27), rng.choice([-(1 << 63), (1 << 63) - 1, 1 << 32], shape), out)
            return out.astype(np.int64)

        return {
            "shop": column(SHOPS, (batch, self.length)),
            "brand": column(BRANDS, (batch,)),
            "item": column(self.items, (batch,)),
            "dense": rng.random((batch, 4), dtype=np.float32),
        }


def build_int_vocabulary(root: Path, *, dim: int = 16, items: int = 5000, length: int = 3,
                         hidden: tuple[int, ...] = (64,), seed: int = 0) -> IntVocabularyModel:
    """Three integer-vocabulary bindings (see IntVocabularyModel): `shop` ([batch, length],
    mean; SHOPS), `brand` (one id; unknown ids to key 1, as TensorFlow's default_value=1),
    `item` (Keras IntegerLookup's keying of `items` random ids, -1 among them: keys from 1,
    unknown ids 0, -1 looked up). Every table misses some keys (their rows are the default).
    Outputs `prob` and `features`, the MLP's input, where the embeddings can be read."""
    rng = np.random.default_rng(seed)
    distinct = rng.permutation(np.unique(rng.integers(0, 1 << 40, 2 * items))[: items - 1])
    item_ids = (-1, *(int(i) for i in distinct))
    normal = DefaultSpec(kind="normal", stddev=0.5, seed=3)
    bindings = (
        EmbeddingBinding(input="shop", table="shops", dim=dim, graph_input="e_shop", vocabulary=SHOPS,
                         combiner="mean"),
        EmbeddingBinding(input="brand", table="brands", dim=dim, graph_input="e_brand", vocabulary=BRANDS,
                         default_id=1, default=normal),
        EmbeddingBinding(input="item", table="items", dim=dim, graph_input="e_item", vocabulary=item_ids,
                         vocabulary_start=1, default_id=0, empty_is_padding=False),
    )
    parts = ["dense"] + [b.graph_input for b in bindings]
    inputs = [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", 4])]
    inputs += [helper.make_tensor_value_info(b.graph_input, TensorProto.FLOAT, ["batch", dim]) for b in bindings]
    width = 4 + len(bindings) * dim
    concat = helper.make_node("Concat", parts, ["features"], axis=1)
    nodes, inits = _mlp([width, *hidden, 1], rng)
    outputs = [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["batch", 1]),
               helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", width])]
    graph = helper.make_graph([concat, *nodes], "int_vocabulary", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    spec = ModelSpec(embeddings=bindings, signatures={"serving_default": SignatureSpec(
        inputs={b.input: b.input for b in bindings} | {"dense": "dense"},
        outputs={"prob": "prob", "features": "features"})})
    model_dir = Path(write_model_dir(root / "int_vocabulary_model", model, spec))

    def rows(keys: range) -> tuple[np.ndarray, np.ndarray]:
        return np.array(keys, dtype=np.int64), rng.standard_normal((len(keys), dim), dtype=np.float32)

    tables = {"shops": rows(range(0, len(SHOPS), 2)), "brands": rows(range(1, len(BRANDS), 2)),
              "items": rows(range(0, items + 1, 2))}   # key 0 (unknown items) has a row
    checkpoint_dir = root / "int_vocabulary_checkpoints"
    write_checkpoint(checkpoint_dir, tables, global_step=1)
    return IntVocabularyModel(root, model_dir, checkpoint_dir, item_ids, length)
