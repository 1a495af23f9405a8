"""Parity: Processor.predict equals a direct onnxruntime run of model.onnx fed with
embeddings gathered in numpy from the checkpoint files (recserve.export.reference), over
1,000 random requests with unknown keys, padding and string ids."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve import Processor
from recserve.export import write_checkpoint, write_model_dir
from recserve.export.demo import write_demo
from recserve.export.reference import Reference
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec, SignatureSpec
from recserve.wire.codec import decode_response, encode_request

ROWS = 100_000
DIM = 8


def _random_model(root: Path) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """Every binding shape the engine supports, over 100k-row tables with random int64 keys."""
    rng = np.random.default_rng(7)
    bindings = (
        EmbeddingBinding(input="user", table="users", dim=DIM, graph_input="e_user"),
        EmbeddingBinding(input="hist_sum", table="items", dim=DIM, graph_input="e_sum", combiner="sum"),
        EmbeddingBinding(input="hist_mean", table="items", dim=DIM, graph_input="e_mean", combiner="mean"),
        EmbeddingBinding(input="hist_sqrtn", table="items", dim=DIM, graph_input="e_sqrtn", combiner="sqrtn"),
        EmbeddingBinding(input="seq", table="items", dim=DIM, graph_input="e_seq", combiner="none"),
        EmbeddingBinding(
            input="city", table="cities", dim=DIM, graph_input="e_city", key_dtype="string",
            default=DefaultSpec(kind="normal", stddev=0.5, seed=11),
        ),
    )
    pooled = ["e_user", "e_sum", "e_mean", "e_sqrtn", "e_city"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", DIM]) for n in pooled]
    inputs.append(helper.make_tensor_value_info("e_seq", TensorProto.FLOAT, ["B", "L", DIM]))
    inputs.append(helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["B", 3]))
    w = (rng.standard_normal((3 + 6 * DIM, 4)) / np.sqrt(3 + 6 * DIM)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceSum", ["e_seq", "axes1"], ["seq_pooled"], keepdims=0),
        helper.make_node("Concat", ["dense", *pooled, "seq_pooled"], ["x"], axis=1),
        helper.make_node("MatMul", ["x", "W"], ["logits"]),
        helper.make_node("Sigmoid", ["logits"], ["prob"]),
    ]
    graph = helper.make_graph(
        nodes, "parity", inputs,
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, ["B", 4]),
         helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", 4])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(np.array([1], np.int64), "axes1")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    spec = ModelSpec(
        embeddings=bindings,
        signatures={"serving_default": SignatureSpec(
            inputs={b.input: b.input for b in bindings} | {"dense_features": "dense"},
            outputs={"probabilities": "prob", "logits": "logits"},
        )},
    )
    model_dir = write_model_dir(root / "model", model, spec)
    from recserve.embedding import string_keys

    city_names = np.array([f"city-{i}".encode() for i in range(2000)], dtype=object)
    tables = {
        "users": (rng.choice(2**62, ROWS, replace=False).astype(np.int64), rng.standard_normal((ROWS, DIM), dtype=np.float32)),
        "items": (rng.choice(2**62, ROWS, replace=False).astype(np.int64), rng.standard_normal((ROWS, DIM), dtype=np.float32)),
        "cities": (string_keys(city_names), rng.standard_normal((2000, DIM), dtype=np.float32)),
    }
    dense = {"W": (rng.standard_normal(w.shape) / np.sqrt(w.shape[0])).astype(np.float32)}  # overrides the graph's W
    checkpoint_dir = root / "checkpoints"
    write_checkpoint(checkpoint_dir, tables, global_step=10, dense=dense)
    return Path(model_dir), checkpoint_dir, {"users": tables["users"][0], "items": tables["items"][0], "cities": city_names}


def _random_request(rng: np.random.Generator, known: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    b = int(rng.integers(1, 9))
    length = int(rng.integers(1, 6))

    def ids(table: str, shape: tuple[int, ...]) -> np.ndarray:
        pool = known[table]
        out = pool[rng.integers(0, len(pool), shape)]
        unknown = rng.random(shape) < 0.15
        out[unknown] = rng.integers(0, 2**62, int(unknown.sum()))
        return out

    def padded(table: str) -> np.ndarray:
        arr = ids(table, (b, length))
        for row in range(b):  # trailing -1 padding, sometimes a whole row of it
            arr[row, int(rng.integers(0, length + 1)):] = -1
        return arr

    cities = known["cities"][rng.integers(0, len(known["cities"]), b)].copy()
    for i in range(b):
        if rng.random() < 0.2:
            cities[i] = f"nowhere-{rng.integers(1 << 30)}".encode()
    return {
        "user": ids("users", (b,)),
        "hist_sum": padded("items"),
        "hist_mean": padded("items"),
        "hist_sqrtn": padded("items"),
        "seq": padded("items"),
        "city": cities,
        "dense_features": rng.standard_normal((b, 3)).astype(np.float32),
    }


@pytest.fixture(scope="module")
def random_model(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("parity")
    model_dir, checkpoint_dir, known = _random_model(root)
    processor = Processor({"savedmodel_dir": str(model_dir), "checkpoint_dir": str(checkpoint_dir)})
    yield processor, model_dir, checkpoint_dir, known
    processor.close()


def _over_the_wire(processor: Processor, request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    status, body = processor.process(encode_request(request))
    assert status == 200, body[:300]
    return decode_response(body)


@pytest.mark.parametrize(
    ("serve", "seed"),
    [
        (Processor.predict, 3),
        # PredictRequest bytes in and out: the path of the C ABI and the servers, where
        # each request layout is served by its route (recserve.processor.request_route).
        (_over_the_wire, 13),
    ],
    ids=["predict", "process"],
)
def test_random_model_matches_reference_over_1000_requests(random_model, serve, seed) -> None:
    processor, model_dir, checkpoint_dir, known = random_model
    reference = Reference(model_dir, checkpoint_dir / "10")
    rng = np.random.default_rng(seed)
    worst = 0.0
    for _ in range(1000):
        request = _random_request(rng, known)
        got = serve(processor, request)
        want = reference.predict(request)
        assert set(got) == {"probabilities", "logits"}
        for alias in ("probabilities", "logits"):
            assert got[alias].shape == want[alias].shape
            worst = max(worst, float(np.max(np.abs(got[alias] - want[alias]))))
    assert worst <= 1e-6


def test_dense_override_is_served(random_model) -> None:
    """The checkpoint's W differs from the graph's: serving the graph's would differ."""
    processor, model_dir, checkpoint_dir, known = random_model
    request = _random_request(np.random.default_rng(5), known)
    graph_w = numpy_helper.to_array(
        next(i for i in onnx.load(str(model_dir / "model.onnx")).graph.initializer if i.name == "W")
    )
    from safetensors.numpy import load_file

    assert not np.array_equal(graph_w, load_file(str(checkpoint_dir / "10" / "dense.safetensors"))["W"])
    got = processor.predict(request, ["logits"])
    want = Reference(model_dir, checkpoint_dir / "10").predict(request)
    np.testing.assert_allclose(got["logits"], want["logits"], atol=1e-6, rtol=0)


def test_demo_model_matches_reference_over_1000_requests(tmp_path: Path) -> None:
    demo = write_demo(tmp_path / "demo")
    processor = Processor(demo.config_path.read_text())
    reference = Reference(demo.model_dir, demo.version_dir)
    try:
        rng = np.random.default_rng(4)
        worst = 0.0
        for _ in range(1000):
            request = demo.sample_inputs(int(rng.integers(1, 9)), rng)
            got = processor.predict(request)
            want = reference.predict(request)
            assert set(got) == set(want) == {"probabilities", "logits"}
            for alias, value in got.items():
                worst = max(worst, float(np.max(np.abs(value - want[alias]))))
        assert worst <= 1e-6
    finally:
        processor.close()
