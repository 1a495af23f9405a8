"""`Processor.predict` on the native route (recserve.processor.native_predict): for every
request shape it serves, the answer must be the Python route's exactly (keys and their order,
dtypes, shapes, bytes) and a direct ONNX Runtime / reference run's; everything it does not
serve, errors above all, must come from the Python route unchanged."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from benchmarks.models import build_string_keyed
from recserve import Processor
from recserve.errors import RecserveError
from recserve.export import write_model_dir
from recserve.export.demo import DemoModel
from recserve.export.reference import Reference
from recserve.model_spec import ModelSpec
from recserve.processor import native_predict
from recserve.processor.trace import RequestTrace
from recserve.wire import codec
from tests.threads import Threads

pytestmark = pytest.mark.skipif(codec._native is None or native_predict._process_values is None,
                                reason="the native route needs its libraries (RECSERVE_PURE_PYTHON=1)")

WAIT = 60.0  # seconds: every wait below has this bound


@pytest.fixture(autouse=True)
def _no_packing_bugs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A packing the C parser disagrees with, or a route build failing, is logged as a bug:
    none may happen here (it would also send the shape to the Python route silently)."""
    yield
    assert not [r.getMessage() for r in caplog.records if r.getMessage().startswith("native predict:")]


def _python_predict(processor: Processor, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None,
                    signature_name: str | None = None) -> dict[str, np.ndarray]:
    """The spec: the Python route (Servable.predict) on the current version."""
    with processor._manager.acquire() as servable:
        return servable.predict(inputs, outputs, signature_name=signature_name)


def _served(processor: Processor) -> int:
    return int(processor.model_info()["native_route"]["served"])


def _assert_same(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert type(got[key]) is np.ndarray
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        assert got[key].tobytes() == value.tobytes(), key
        assert got[key].flags.writeable and got[key].flags.aligned


def _assert_native(processor: Processor, inputs: Mapping[str, Any], outputs: Sequence[str] | None = None,
                   signature_name: str | None = None, native: bool = True) -> dict[str, np.ndarray]:
    want = _python_predict(processor, inputs, outputs, signature_name)
    processor.predict(inputs, outputs, signature_name=signature_name)   # a new layout: its route is built
    before = _served(processor)
    got = processor.predict(inputs, outputs, signature_name=signature_name)
    _assert_same(got, want)
    assert _served(processor) == before + (1 if native else 0)
    return got


@pytest.fixture(scope="module")
def demo_reference(demo: DemoModel) -> Reference:
    return Reference(demo.model_dir, demo.version_dir)


def _close_to_reference(got: Mapping[str, np.ndarray], want: Mapping[str, np.ndarray]) -> None:
    for key, value in got.items():
        np.testing.assert_allclose(value, want[key], atol=1e-6, rtol=0)


def test_demo_requests_of_every_batch_size_are_native_and_exact(
    processor: Processor, demo: DemoModel, demo_reference: Reference
) -> None:
    assert processor.model_info()["native_route"]["enabled"]
    rng = np.random.default_rng(5)
    for batch in (1, 2, 3, 7, 8, 64, 512, *rng.integers(1, 100, 6).tolist()):
        inputs = demo.sample_inputs(batch, rng)
        got = _assert_native(processor, inputs)
        _close_to_reference(got, demo_reference.predict(inputs))
        # The next request of the shape: new values, the same route.
        again = demo.sample_inputs(batch, rng)
        before = _served(processor)
        _assert_same(processor.predict(again), _python_predict(processor, again))
        assert _served(processor) == before + 1


def test_output_filters_signature_names_lists_and_every_wire_dtype_are_native(
    processor: Processor, demo: DemoModel, demo_reference: Reference
) -> None:
    rng = np.random.default_rng(6)
    for outputs in (["probabilities"], ["logit"], ["logits", "prob:0"], ["probabilities", "probabilities"], []):
        _assert_native(processor, demo.sample_inputs(4, rng), outputs)
    _assert_native(processor, demo.sample_inputs(2, rng), signature_name="serving_default")
    # Strings as str, narrow integers, bools.
    inputs = demo.sample_inputs(3, rng)
    inputs["user_id"] = np.array([-5, 7, 2**31 - 1], np.int32)
    inputs["item_id"] = inputs["item_id"].astype(np.uint16)
    inputs["query_category"] = inputs["query_category"].astype(np.uint8)
    inputs["item_category"] = np.array([0, 1, 1], np.bool_)
    inputs["age"] = np.array([[18], [40], [-3]], np.int16)
    inputs["hour"] = np.array([[1], [2], [-3]], np.int8)
    inputs["city"] = np.array(["Hangzhou", "東京", ""], dtype=object)
    _assert_native(processor, inputs)
    _close_to_reference(processor.predict(inputs), demo_reference.predict(inputs))
    # Lists (as JSON handlers may pass them): ids and strings (a list of floats is float64,
    # which the signature refuses for a float32 input).
    as_lists = {name: value.tolist() if value.dtype != np.float32 else value
                for name, value in demo.sample_inputs(5, rng).items()}
    _assert_native(processor, as_lists)
    for strings in (np.array(["Beijing", "北京", "nowhere"]), np.array([b"Beijing", b"x\x00y", b""]),
                    ["Beijing", b"Shanghai", ""], np.array(["Beijing", b"Shanghai", "", "東京", b"\xff\xfe"] * 20, dtype=object)):
        inputs = demo.sample_inputs(len(strings), rng)
        inputs["city"] = strings
        _assert_native(processor, inputs)


def test_requests_it_does_not_serve_are_the_python_routes(processor: Processor, demo: DemoModel) -> None:
    rng = np.random.default_rng(7)
    inputs = demo.sample_inputs(3, rng)
    inputs["price"] = inputs["price"].astype(np.float16)   # no native reader: served by Python
    _assert_native(processor, inputs, native=False)
    inputs = demo.sample_inputs(3, rng)
    inputs["city"] = np.array([b"a", 5, b"c"], dtype=object)  # not strings: Python's error
    with pytest.raises(RecserveError):
        _python_predict(processor, inputs)
    traced = RequestTrace(want_ort_profile=True)
    inputs = demo.sample_inputs(2, rng)
    before = _served(processor)
    _assert_same(processor.predict(inputs, trace=traced), _python_predict(processor, inputs))
    assert traced.ort_profile_path is not None and _served(processor) == before


def test_a_natively_served_predict_is_traced(processor: Processor, demo: DemoModel) -> None:
    inputs = demo.sample_inputs(4, np.random.default_rng(8))
    processor.predict(inputs)
    before = _served(processor)
    trace = RequestTrace()
    processor.predict(inputs, trace=trace)
    assert _served(processor) == before + 1
    assert trace.batch_size == 4 and trace.model_version == processor.model_info()["version"]
    assert [span.stage for span in trace.spans] == ["lookup", "run"]   # as Servable.predict traces
    assert all(0 < span.end_ns - span.start_ns < 10**10 for span in trace.spans)
    # the C call's wall time, the GIL released (the server's InlinePolicy weighs it)
    assert trace.released_ns == trace.spans[-1].end_ns - trace.spans[0].start_ns


def _bad_requests(demo: DemoModel) -> list[tuple[dict[str, Any], Sequence[str] | None, str | None]]:
    rng = np.random.default_rng(9)

    def changed(**changes: Any) -> dict[str, Any]:
        inputs: dict[str, Any] = demo.sample_inputs(3, rng)
        for name, value in changes.items():
            if value is None:
                del inputs[name]
            else:
                inputs[name] = value
        return inputs

    good = demo.sample_inputs(3, rng)
    return [
        (changed(user_id=np.array([1.5, 2, 3], np.float32)), None, None),          # unsafe cast
        (changed(user_id=np.array([1, 2, 3], np.uint64)), None, None),             # no wire dtype
        (changed(user_id=np.array(["1", "2", "3"])), None, None),                  # strings for ids
        (changed(city=np.array([1, 2, 3])), None, None),                           # ids for strings
        (changed(age=np.zeros((3, 2), np.float32)), None, None),                   # wrong shape
        (changed(age=np.zeros((2, 1), np.float32)), None, None),                   # inconsistent batch
        (changed(age=np.zeros((3,), np.float32)), None, None),                     # wrong rank
        (changed(age=None), None, None),                                           # missing
        (changed(nonsense=np.zeros(3, np.int64)), None, None),                     # unknown input
        (changed(user=good["user_id"]), None, None),                               # both alias and name?
        (changed(age=[[1.0], [2.0, 3.0], [4.0]]), None, None),   # ragged list (the Python route: a 500)
        (good, ["no_such_output"], None),
        (good, None, "no_such_signature"),
    ]


def test_bad_requests_raise_the_python_routes_errors(processor: Processor, demo: DemoModel,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    for inputs, outputs, signature_name in _bad_requests(demo):
        for _ in range(2):   # the second time too: nothing about it is cached as servable
            with monkeypatch.context() as m, pytest.raises(RecserveError) as want:
                m.setattr(native_predict, "_process_values", None)   # Processor.predict as it was
                processor.predict(inputs, outputs, signature_name=signature_name)
            before = _served(processor)
            with pytest.raises(RecserveError) as got:
                processor.predict(inputs, outputs, signature_name=signature_name)
            assert type(got.value) is type(want.value)
            assert got.value.message == want.value.message
            assert _served(processor) == before


def test_the_plain_dlrm_model_is_native_and_equals_onnxruntime(plain_processor: Processor, plain) -> None:
    session = ort.InferenceSession(str(plain.onnx_path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(10)
    for batch in (1, 2, 64, 512, 33):
        inputs = plain.sample(batch, rng)
        got = _assert_native(plain_processor, inputs)
        (want,) = session.run(["prob"], inputs)
        np.testing.assert_allclose(got["prob"], want, atol=1e-6, rtol=0)
        ids_as_int32 = {k: v.astype(np.int32) if k != "dense" else v for k, v in inputs.items()}
        _assert_native(plain_processor, ids_as_int32)


@pytest.fixture(scope="module")
def dtypes_processor(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Processor]:
    """A plain ONNX model (no tables) of every dense dtype the native route feeds, with
    outputs of every dtype the native encoder writes, and one whose shape depends on the
    values (`picked`: the rows of f where t is true)."""
    b = "B"
    graph = helper.make_graph(
        [helper.make_node("Mul", ["f", "f"], ["f2"]),
         helper.make_node("Add", ["d", "d"], ["d2"]),
         helper.make_node("Cast", ["i"], ["i_f"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["l"], ["l_f"], to=TensorProto.FLOAT),
         helper.make_node("Cast", ["t"], ["t_f"], to=TensorProto.FLOAT),
         helper.make_node("Sum", ["i_f", "l_f", "t_f"], ["s"]),
         helper.make_node("Add", ["l", "l"], ["l2"]),
         helper.make_node("Add", ["i", "i"], ["i2"]),
         helper.make_node("Not", ["t"], ["t2"]),
         helper.make_node("Compress", ["f", "t"], ["picked"], axis=0)],
        "dtypes",
        [helper.make_tensor_value_info("f", TensorProto.FLOAT, [b, 2]),
         helper.make_tensor_value_info("d", TensorProto.DOUBLE, [b, 2]),
         helper.make_tensor_value_info("i", TensorProto.INT32, [b]),
         helper.make_tensor_value_info("l", TensorProto.INT64, [b]),
         helper.make_tensor_value_info("t", TensorProto.BOOL, [b])],
        [helper.make_tensor_value_info("f2", TensorProto.FLOAT, [b, 2]),
         helper.make_tensor_value_info("d2", TensorProto.DOUBLE, [b, 2]),
         helper.make_tensor_value_info("s", TensorProto.FLOAT, [b]),
         helper.make_tensor_value_info("l2", TensorProto.INT64, [b]),
         helper.make_tensor_value_info("i2", TensorProto.INT32, [b]),
         helper.make_tensor_value_info("t2", TensorProto.BOOL, [b]),
         helper.make_tensor_value_info("picked", TensorProto.FLOAT, ["K", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    root = tmp_path_factory.mktemp("dtypes")
    write_model_dir(root / "model", model, ModelSpec())
    p = Processor({"savedmodel_dir": str(Path(root / "model"))})
    p.onnx_path = root / "model" / "model.onnx"   # type: ignore[attr-defined]
    yield p
    p.close()


def _dtypes_request(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"f": rng.standard_normal((batch, 2)).astype(np.float32), "d": rng.standard_normal((batch, 2)),
            "i": rng.integers(-1000, 1000, batch).astype(np.int32), "l": rng.integers(-2**40, 2**40, batch),
            "t": rng.random(batch) < 0.5}


def test_a_plain_onnx_model_of_every_native_dtype_equals_onnxruntime(dtypes_processor: Processor) -> None:
    session = ort.InferenceSession(str(dtypes_processor.onnx_path), providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    rng = np.random.default_rng(11)
    floats = ["f2", "d2", "s"]
    for batch in (1, 3, 64):
        inputs = _dtypes_request(batch, rng)
        got = _assert_native(dtypes_processor, inputs, floats)
        _assert_same(got, dict(zip(floats, session.run(floats, inputs))))
        # Safe casts the signature makes: narrower ints, float32 to double, bool to int.
        cast = {**inputs, "d": inputs["d"].astype(np.float32), "i": inputs["i"].astype(np.int16),
                "l": inputs["t"].astype(np.uint8)}
        _assert_native(dtypes_processor, cast, floats)
        # Integer and bool outputs (no plan: the generated parser reads those responses).
        got = _assert_native(dtypes_processor, inputs, None)
        _assert_same(got, dict(zip(got, session.run(list(got), inputs))))
        _assert_native(dtypes_processor, inputs, ["l2", "f2"])
        _assert_native(dtypes_processor, inputs, ["t2", "s", "i2:0"])


def test_outputs_whose_shape_changes_within_a_layout_are_exact(dtypes_processor: Processor) -> None:
    rng = np.random.default_rng(15)
    for outputs in (["picked"], ["picked", "f2"]):
        dtypes_processor.predict(_dtypes_request(4, rng), outputs)   # the layouts' routes
    for picked in ([1, 0, 0, 1], [1, 1, 1, 1], [0, 1, 0, 0], [1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 0]):
        inputs = {**_dtypes_request(4, rng), "t": np.array(picked, np.bool_)}
        for outputs in (["picked"], ["picked", "f2"]):
            want = _python_predict(dtypes_processor, inputs, outputs)
            before = _served(dtypes_processor)
            _assert_same(dtypes_processor.predict(inputs, outputs), want)
            assert _served(dtypes_processor) == before + 1


def test_edge_shapes_answer_as_the_python_route(dtypes_processor: Processor, monkeypatch: pytest.MonkeyPatch) -> None:
    """Empty batches, scalars, extra dimensions: whatever Processor.predict answered before
    (outputs or an error), it answers now."""
    rng = np.random.default_rng(13)
    base = _dtypes_request(2, rng)
    cases = [_dtypes_request(0, rng), {**base, "i": np.int32(3)}, {**base, "f": base["f"][None]},
             {**base, "t": base["t"].tolist()}, {**base, "l": base["l"].tolist()}]
    for inputs in cases:
        for outputs in (None, ["f2"]):
            with monkeypatch.context() as m:
                m.setattr(native_predict, "_process_values", None)   # Processor.predict as it was
                try:
                    want: Any = dtypes_processor.predict(inputs, outputs)
                except RecserveError as exc:
                    want = exc
            for _ in range(2):
                try:
                    got: Any = dtypes_processor.predict(inputs, outputs)
                except RecserveError as exc:
                    assert isinstance(want, RecserveError) and exc.message == want.message
                else:
                    assert not isinstance(want, RecserveError), want
                    _assert_same(got, want)


def test_threads_get_exact_answers(processor: Processor, demo: DemoModel, plain_processor: Processor,
                                   plain) -> None:
    rng = np.random.default_rng(12)
    cases = []
    for i in range(48):
        if i % 3:
            inputs = demo.sample_inputs(int(rng.integers(1, 20)), rng)
            cases.append((processor, inputs, _python_predict(processor, inputs)))
        else:
            inputs = plain.sample(int(rng.integers(1, 20)), rng)
            cases.append((plain_processor, inputs, _python_predict(plain_processor, inputs)))
    before = _served(processor) + _served(plain_processor)

    def worker(offset: int) -> None:
        for round_ in range(3):
            for k in range(len(cases)):
                processor, inputs, want = cases[(k + offset) % len(cases)]
                _assert_same(processor.predict(inputs), want)

    Threads([lambda o=o: worker(o) for o in range(4)], "predict").join(WAIT)
    # Every request is served natively but the first of each request shape on each thread
    # (at worst: threads meeting a new shape at once each miss its route).
    shapes = {(id(processor), next(iter(inputs.values())).shape[0]) for processor, inputs, _ in cases}
    assert _served(processor) + _served(plain_processor) - before >= 4 * 3 * len(cases) - 4 * len(shapes)


def test_string_keyed_inputs_are_native_and_equal_the_reference(tmp_path: Path) -> None:
    """Five string inputs (hash buckets, XXH64, vocabularies with OOV buckets, ragged tags):
    each request's strings laid back to back in one buffer."""
    model = build_string_keyed(tmp_path, output_features=True)
    processor = Processor(model.config())
    try:
        reference = Reference(model.model_dir, model.checkpoint_dir)
        rng = np.random.default_rng(14)
        for batch in (1, 5, 40, 64):
            inputs = model.sample(batch, rng)
            got = _assert_native(processor, inputs)
            np.testing.assert_array_equal(got["features"], reference.predict(inputs)["features"])
            as_text = {name: np.array([w.decode("utf-8", "replace") for w in value.ravel().tolist()],
                                      dtype=object).reshape(value.shape)
                       if value.dtype == object else value for name, value in inputs.items()}
            _assert_native(processor, as_text)
    finally:
        processor.close()
