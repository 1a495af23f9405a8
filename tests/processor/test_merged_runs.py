"""Request merging in the processor (Processor.process_many, recserve.processor.merged_runs):
each caller's answer is byte for byte what it gets unmerged, one malformed request fails
only itself, and runs are cut at max_rows."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from recserve import Processor
from recserve.export.demo import DemoModel, write_demo
from recserve.processor.trace import RequestTrace
from recserve.wire.codec import decode_response, encode_request

BATCHES = (1, 3, 1, 7, 2, 1, 16, 1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return write_demo(tmp_path_factory.mktemp("merged") / "demo")


@pytest.fixture(scope="module")
def processor(demo: DemoModel) -> Processor:
    p = Processor(json.loads(demo.config_path.read_text()))
    yield p
    p.close()


def _bodies(demo: DemoModel) -> list[bytes]:
    rng = np.random.default_rng(7)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in BATCHES]
    bodies.insert(3, encode_request(demo.sample_inputs(2, rng), signature_name="no_such_signature"))
    bodies.insert(5, b"\x0a\x07garbage\xff")
    return bodies


def test_each_caller_gets_exactly_its_unmerged_answer(demo: DemoModel, processor: Processor) -> None:
    bodies = _bodies(demo)
    alone = [processor.process(b) for b in bodies]
    traces = [RequestTrace() for _ in bodies]
    merged = processor.process_many(bodies, traces, 256)
    assert merged == alone  # status and bytes, the errors' messages included
    assert merged[3][0] == 400 and b"unknown signature_name 'no_such_signature'" in merged[3][1]
    assert merged[5][0] == 400
    assert [t.merged_with for t in traces] == [8, 8, 8, 1, 8, 1, 8, 8, 8, 8]
    assert [t.batch_size for i, t in enumerate(traces) if i not in (3, 5)] == list(BATCHES)
    assert all(t.seconds("run") > 0 for i, t in enumerate(traces) if i not in (3, 5))


def test_runs_are_cut_at_max_rows_and_a_big_request_runs_alone(demo: DemoModel, processor: Processor) -> None:
    rng = np.random.default_rng(5)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in (3, 3, 3, 9, 2)]
    traces = [RequestTrace() for _ in bodies]
    merged = processor.process_many(bodies, traces, 8)
    assert merged == [processor.process(b) for b in bodies]
    # 3+3 fit in 8, the third 3 starts a run with the 2; 9 >= 8 runs alone.
    assert [t.merged_with for t in traces] == [2, 2, 2, 1, 2]


def test_an_empty_payload_asks_for_the_signature(demo: DemoModel, processor: Processor) -> None:
    one = encode_request(demo.sample_inputs(1, np.random.default_rng(2)))
    merged = processor.process_many([b"", one], [RequestTrace(), RequestTrace()], 64)
    assert merged == [processor.process(b""), processor.process(one)]


def test_a_plain_onnx_model_merged_equals_onnxruntime(tmp_path: Path) -> None:
    """A graph with no tables: every caller's rows against onnxruntime's own run of its rows."""
    from onnx import TensorProto, helper, save

    w = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Sigmoid", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
    model_dir = tmp_path / "plain"
    model_dir.mkdir()
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model_dir / "model.onnx"))
    p = Processor({"savedmodel_dir": str(model_dir)})
    try:
        rng = np.random.default_rng(1)
        rows = [rng.standard_normal((n, 6)).astype(np.float32) for n in (1, 4, 2, 1)]
        bodies = [encode_request({"x": r}) for r in rows]
        bodies.insert(2, encode_request({"x": rng.standard_normal((2, 5)).astype(np.float32)}))  # wrong width
        traces = [RequestTrace() for _ in bodies]
        merged = p.process_many(bodies, traces, 64)
        assert merged[2][0] == 400 and b"x" in merged[2][1]
        session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        for (status, body), r in zip(merged[:2] + merged[3:], rows):
            assert status == 200
            (want,) = session.run(["y"], {"x": r})
            assert decode_response(body)["y"].tobytes() == want.tobytes()
        assert [t.merged_with for t in traces] == [4, 4, 1, 4, 4]
    finally:
        p.close()
