"""Folding a Concat of graph inputs into one graph input (recserve.runtime.input_concat):
which graphs fold, and that the folded graph fed by `InputConcat.fold` answers exactly like
the graph as written, in a real ONNX Runtime session."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.runtime.input_concat import fold_input_concat


def _model(parts: list[tuple[str, int]], *, axis: int = 1, extra_use: str | None = None,
           rank3: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    width = sum(w for _, w in parts)
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", 2, w] if rank3 else ["batch", w])
        for name, w in parts
    ]
    nodes = [helper.make_node("Concat", [name for name, _ in parts], ["features"], axis=axis)]
    weight = numpy_helper.from_array(rng.standard_normal((width, 4)).astype(np.float32), "W")
    nodes.append(helper.make_node("MatMul", ["features", "W"], ["out"]))
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    if extra_use is not None:
        nodes.append(helper.make_node("Identity", [extra_use], ["also"]))
        outputs.append(helper.make_tensor_value_info("also", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "g", inputs, outputs, [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


PARTS = [("dense", 3), ("emb0", 4), ("emb1", 4), ("emb2", 4)]


def test_a_dlrm_style_concat_becomes_one_input_with_the_same_answers() -> None:
    model = _model(PARTS)
    original = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    folded_model = onnx.ModelProto()
    folded_model.CopyFrom(model)
    concat = fold_input_concat(folded_model)
    assert concat is not None
    assert concat.output == "features" and concat.parts == ("dense", "emb0", "emb1", "emb2")
    folded = ort.InferenceSession(folded_model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in folded.get_inputs()] == [("features", ["batch", 15])]
    rng = np.random.default_rng(1)
    for batch in (1, 5):
        feeds = {name: rng.standard_normal((batch, w)).astype(np.float32) for name, w in PARTS}
        want = original.run(None, feeds)[0]
        got = folded.run(None, concat.fold(feeds))[0]
        assert np.array_equal(got, want)


@pytest.mark.parametrize(
    "model, why",
    [
        (_model(PARTS[:2]), "fewer than three parts"),
        (_model(PARTS, extra_use="emb1"), "a part is read by another node too"),
        (_model(PARTS, axis=0), "concatenates along the batch"),
        (_model(PARTS, rank3=True), "parts are not rank 2"),
    ],
)
def test_graphs_that_do_not_fold_are_left_as_written(model: onnx.ModelProto, why: str) -> None:
    before = model.SerializeToString()
    assert fold_input_concat(model) is None, why
    assert model.SerializeToString() == before


def test_a_batch_mismatch_between_parts_is_a_value_error() -> None:
    concat = fold_input_concat(_model(PARTS))
    assert concat is not None
    feeds = {name: np.zeros((2 if name == "emb2" else 1, w), np.float32) for name, w in PARTS}
    with pytest.raises(ValueError):
        concat.fold(feeds)
