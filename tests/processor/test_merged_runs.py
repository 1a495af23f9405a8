"""Request merging in the processor (Processor.process_many): on the native route
(rs_route_process_many, native/route_merge.inc) and on the Python path it falls back to
(recserve.processor.merged_runs), each caller's answer is byte for byte what it gets
unmerged, one malformed request fails only itself, and runs are cut at max_rows."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from recserve import Processor
from recserve.export.demo import DemoModel, write_demo
from recserve.export.reference import Reference
from recserve.model_store.checkpoint import Checkpoint
from recserve.model_store.manifest import Manifest
from recserve.model_store.versions import VersionRef
from recserve.processor import native_route
from recserve.processor.trace import RequestTrace
from recserve.wire import codec
from recserve.wire.codec import decode_response, encode_request
from tests.reference_answers import ATOL
from tests.threads import Threads

native_only = pytest.mark.skipif(codec._native is None or native_route._CALL is None,
                                 reason="the native route needs the native parser and its library")

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


# -- the native route's merging (rs_route_process_many) -----------------------------------


def _native(processor: Processor) -> dict[str, int]:
    """The native route's counters: served, and each fallback reason."""
    info = processor.model_info()["native_route"]
    return {"served": info["served"], **info["fallbacks"]}


def _python_merging(processor: Processor, bodies: list[bytes], max_rows: int,
                    monkeypatch: pytest.MonkeyPatch) -> tuple[list[tuple[int, bytes]], list[RequestTrace]]:
    """The spec: `process_many` with the native route's merging declining everything, so
    every request takes the Python merged path (recserve.processor.merged_runs)."""
    traces = [RequestTrace() for _ in bodies]
    with monkeypatch.context() as m:
        m.setattr(native_route.RouteSlot, "process_many", lambda self, payloads, t, rows: [None] * len(payloads))
        return processor.process_many(bodies, traces, max_rows), traces


def _natively_merged(processor: Processor, bodies: list[bytes], max_rows: int,
                       monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`process_many` of `bodies` on the native route: every request served natively, each
    answer byte for byte its unmerged one and the Python merged path's; how many requests
    shared each one's run (RequestTrace.merged_with)."""
    alone = [processor.process(b) for b in bodies]
    before = _native(processor)["served"]
    traces = [RequestTrace() for _ in bodies]
    assert processor.process_many(bodies, traces, max_rows) == alone
    assert _native(processor)["served"] - before == len(bodies)
    assert _python_merging(processor, bodies, max_rows, monkeypatch)[0] == alone
    return [t.merged_with for t in traces]


def _plain_model(tmp_path: Path, nodes: list, inputs: list, outputs: list, initializers: list) -> Path:
    from onnx import helper, save

    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    model_dir = tmp_path / "plain"
    model_dir.mkdir()
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model_dir / "model.onnx"))
    return model_dir


@native_only
def test_native_merging_answers_each_caller_as_alone_and_as_python_merging(
        demo: DemoModel, processor: Processor, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(11)
    inputs = [demo.sample_inputs(b, rng) for b in (1, 3, 64, 1, 2)]
    known = [encode_request(i) for i in inputs]
    for body in known:
        processor.process(body)   # their layouts' routes registered
    first_seen = demo.sample_inputs(13, rng)   # no request of this module has 13 rows before this one
    bodies = [known[0], known[1], b"\x0a\x07garbage\xff", known[2], b"", encode_request(first_seen), *known[3:]]
    before = _native(processor)
    traces = [RequestTrace() for _ in bodies]
    merged = processor.process_many(bodies, traces, 256)
    after = _native(processor)
    assert after["served"] - before["served"] == 5   # the five known layouts, merged in C
    assert after["route_miss"] - before["route_miss"] == 1 and after["parse"] - before["parse"] == 1
    assert [t.merged_with for t in traces] == [5, 5, 1, 5, 1, 1, 5, 5]
    assert [traces[i].batch_size for i in (0, 1, 3, 6, 7)] == [1, 3, 64, 1, 2]
    assert all([s.stage for s in traces[i].spans] == ["decode", "lookup", "run", "encode"] for i in (0, 1, 3, 6, 7))
    assert all(traces[i].model_version == traces[0].model_version != "" for i in (1, 3, 6, 7))
    # The shared C call's GIL-free time, the same on each (recserve.server.merging weighs it).
    (released,) = {traces[i].released_ns for i in (0, 1, 3, 6, 7)}
    assert released >= traces[3].spans[2].end_ns - traces[0].spans[0].start_ns > 0
    # Byte for byte each request's answer alone, and the Python merged path's.
    assert merged == [processor.process(b) for b in bodies]
    python, python_traces = _python_merging(processor, bodies, 256, monkeypatch)
    assert merged == python
    assert [t.merged_with for t in python_traces] == [6, 6, 1, 6, 1, 6, 6, 6]   # the 13 rows have a route now
    assert merged[2][0] == 400 and merged[4][0] == 200 and merged[5][0] == 200
    # And ONNX Runtime's answer (the numpy + onnxruntime reference, rows as initializers).
    reference = Reference(demo.model_dir, demo.version_dir)
    for i, request in zip((0, 1, 3, 5, 6, 7), (*inputs[:3], first_seen, *inputs[3:])):
        got, want = decode_response(merged[i][1]), reference.predict(request)
        assert set(got) == set(want)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=0, err_msg=f"request {i}, {name}")


@native_only
def test_native_merging_cuts_runs_at_max_rows(demo: DemoModel, processor: Processor,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(5)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in (3, 3, 3, 9, 2, 1)]
    alone = [processor.process(b) for b in bodies]
    before = _native(processor)["served"]
    traces = [RequestTrace() for _ in bodies]
    assert processor.process_many(bodies, traces, 8) == alone
    assert _native(processor)["served"] - before == len(bodies)
    # 3+3 fit in 8; the third 3 starts a run with the 2 and the 1; 9 >= 8 runs alone.
    assert [t.merged_with for t in traces] == [2, 2, 3, 1, 3, 3]
    python, python_traces = _python_merging(processor, bodies, 8, monkeypatch)
    assert python == alone
    assert [t.merged_with for t in python_traces] == [t.merged_with for t in traces]


@native_only
def test_native_merging_of_the_folded_concat_model(plain, plain_processor: Processor,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain DLRM model: 26 lookups and a Concat the route folds, per request, before the merge."""
    rng = np.random.default_rng(8)
    bodies = [encode_request(plain.sample(b, rng)) for b in (1, 2, 64, 1, 5)]
    assert _natively_merged(plain_processor, bodies, 128, monkeypatch) == [5] * 5


@native_only
def test_a_graph_that_is_not_row_independent_runs_each_request_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An output summed over the batch (dim 0 is 1, not the run's rows): a merged run would
    mix the callers' rows, so each runs alone, and each answer is ONNX Runtime's for its rows."""
    from onnx import TensorProto, helper

    w = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    model_dir = _plain_model(
        tmp_path,
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("ReduceSum", ["x", "axes"], ["total"])],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 4]),
         helper.make_tensor_value_info("total", TensorProto.FLOAT, [1, 6])],
        [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel()),
         helper.make_tensor("axes", TensorProto.INT64, [1], [0])])
    p = Processor({"savedmodel_dir": str(model_dir)})
    try:
        rng = np.random.default_rng(1)
        rows = [rng.standard_normal((n, 6)).astype(np.float32) for n in (1, 2, 3, 1)]
        bodies = [encode_request({"x": r}) for r in rows]
        alone = [p.process(b) for b in bodies]
        before = _native(p)["served"]
        traces = [RequestTrace() for _ in bodies]
        merged = p.process_many(bodies, traces, 64)
        assert _native(p)["served"] - before == len(bodies)   # natively, each alone
        assert [t.merged_with for t in traces] == [1, 1, 1, 1]
        assert merged == alone
        assert _python_merging(p, bodies, 64, monkeypatch)[0] == alone
        session = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
        for (status, body), r in zip(merged, rows):
            assert status == 200
            got = decode_response(body)
            for name, want in zip(("y", "total"), session.run(["y", "total"], {"x": r})):
                assert got[name].tobytes() == want.tobytes() and got[name].shape == want.shape
    finally:
        p.close()


@native_only
def test_a_request_whose_values_break_the_merged_run_fails_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An index past the table's end: the merged run fails, each request runs alone, and only
    the one with the bad index fails (its error the Python route's, as unmerged)."""
    from onnx import TensorProto, helper

    table = np.random.default_rng(2).standard_normal((10, 4)).astype(np.float32)
    model_dir = _plain_model(
        tmp_path, [helper.make_node("Gather", ["table", "idx"], ["rows"], axis=0)],
        [helper.make_tensor_value_info("idx", TensorProto.INT64, [None])],
        [helper.make_tensor_value_info("rows", TensorProto.FLOAT, [None, 4])],
        [helper.make_tensor("table", TensorProto.FLOAT, table.shape, table.ravel())])
    p = Processor({"savedmodel_dir": str(model_dir)})
    try:
        ids = [np.array([1], np.int64), np.array([2, 3], np.int64), np.array([4, 99], np.int64),
               np.array([9], np.int64)]
        bodies = [encode_request({"idx": i}) for i in ids]
        alone = [p.process(b) for b in bodies]
        assert [status for status, _ in alone] != [200] * 4 and alone[2][0] != 200
        before = _native(p)
        traces = [RequestTrace() for _ in bodies]
        merged = p.process_many(bodies, traces, 64)
        after = _native(p)
        assert merged == alone
        assert [status for status, _ in merged] == [200, 200, alone[2][0], 200]
        assert after["served"] - before["served"] == 3 and after["run"] - before["run"] == 1
        assert [traces[i].merged_with for i in (0, 1, 3)] == [1, 1, 1]
        assert _python_merging(p, bodies, 64, monkeypatch)[0] == alone
        for i in (0, 1, 3):
            assert decode_response(merged[i][1])["rows"].tobytes() == table[ids[i]].tobytes()
    finally:
        p.close()


@native_only
@pytest.mark.parametrize("model", ["demo", "plain"])
def test_native_merging_with_dynamic_batching_on_runs_past_the_batcher(
        model: str, demo: DemoModel, plain, monkeypatch: pytest.MonkeyPatch) -> None:
    """max_batch_size > 0 gives the session group a dynamic batcher (the server's request
    merging sets it): merged runs skip it, as merged_runs' SessionGroup.run(merged=True), on
    the ONNX Runtime C API runner, with the same answers (the plain DLRM model: its Concat
    folded by the route for both runners)."""
    config = json.loads(demo.config_path.read_text()) if model == "demo" else plain.config()
    sample = demo.sample_inputs if model == "demo" else plain.sample
    p = Processor(config | {"max_batch_size": 64})
    try:
        native = p._manager.current.native
        assert isinstance(native._runner, native_route.PythonRunner)   # single requests: the batcher's
        assert isinstance(native._merged_runner, native_route.OrtRunner)
        rng = np.random.default_rng(21)
        bodies = [encode_request(sample(b, rng)) for b in (1, 4, 1, 2)]
        assert _natively_merged(p, bodies, 64, monkeypatch) == [4] * 4
    finally:
        p.close()


@native_only
def test_a_request_that_wants_an_onnx_runtime_profile_takes_the_python_path(
        demo: DemoModel, processor: Processor) -> None:
    rng = np.random.default_rng(4)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in (1, 3, 1)]
    alone = [processor.process(b) for b in bodies]
    traces = [RequestTrace() for _ in bodies]
    traces[1].want_ort_profile = True
    before = _native(processor)
    try:
        assert processor.process_many(bodies, traces, 64) == alone
        after = _native(processor)
        assert after["served"] - before["served"] == 2 and after["trace"] - before["trace"] == 1
        assert [t.merged_with for t in traces] == [2, 1, 2]
        assert traces[1].ort_profile_path   # profiled by the Python path, alone
    finally:
        for trace in traces:
            if trace.ort_profile_path:
                Path(trace.ort_profile_path).unlink(missing_ok=True)


@native_only
def test_threads_merge_natively_while_versions_swap(plain, plain_processor: Processor) -> None:
    """Merged calls from several threads at once, each on one lease of whichever version is
    published, while versions swap (a retired version is freed only after its last lease):
    every answer stays byte for byte the unmerged one (the new version's first request of
    a layout takes the Python path)."""
    rng = np.random.default_rng(50)
    bodies = [encode_request(plain.sample(b, rng)) for b in (1, 1, 2, 8, 3)]
    expected = [plain_processor.process(b) for b in bodies]
    stop = threading.Event()

    def merge(k: int) -> int:
        calls = 0
        while not stop.is_set():
            mine = bodies[k % len(bodies):] + bodies[:k % len(bodies)]
            answers = plain_processor.process_many(mine, [RequestTrace() for _ in mine], 16)
            assert answers == expected[k % len(bodies):] + expected[:k % len(bodies)]
            calls += 1
        return calls

    before = _native(plain_processor)["served"]
    workers = Threads([lambda k=k: merge(k) for k in range(3)], "merged callers")
    try:
        for _ in range(6):
            plain_processor._manager.swap(plain_processor._build(Checkpoint(
                VersionRef("graph", plain_processor.config.savedmodel_dir, 0), Manifest("full", 0, {}), {}, {})))
            stop.wait(0.2)
            workers.check()
    finally:
        stop.set()
    assert all(calls > 0 for calls in workers.join(30.0))
    assert _native(plain_processor)["served"] > before


@native_only
def test_native_merging_of_integer_vocabulary_ids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Integer ids keyed through the servable's vocabularies in each request's own buffers
    before the merge (listed ids, -1, unknown ones): each caller's answer as alone."""
    from benchmarks.models import build_int_vocabulary

    model = build_int_vocabulary(tmp_path / "int_vocabulary", items=50)
    p = Processor(model.config())
    try:
        rng = np.random.default_rng(31)
        bodies = [encode_request(model.sample(b, rng)) for b in (1, 5, 2, 1)]
        assert _natively_merged(p, bodies, 64, monkeypatch) == [4] * 4
    finally:
        p.close()


@native_only
def test_a_failure_of_the_native_call_leaves_every_request_to_the_python_path(
        demo: DemoModel, processor: Processor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(6)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in (1, 2)]
    alone = [processor.process(b) for b in bodies]

    def broken(self, payloads, traces, max_rows):
        raise RuntimeError("a bug in the native call")

    monkeypatch.setattr(native_route.RouteSlot, "process_many", broken)
    traces = [RequestTrace() for _ in bodies]
    assert processor.process_many(bodies, traces, 64) == alone
    assert [t.merged_with for t in traces] == [2, 2]   # merged by the Python path
    assert "a bug in the native call" in caplog.text
