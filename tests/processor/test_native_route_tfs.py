"""The native route's TF Serving entry (rs_route_process_tfs, `Processor.process_tfs`): once a
layout has a route, a tensorflow.serving.PredictRequest is answered in C. Its outputs must be
the bytes the Python route writes (`tfserving_codec.encode_predict_outputs` of what the
generated parser's inputs give), for every dtype and value form the C parser takes, and the
predictions a direct ONNX Runtime run's; what it does not take falls back, counted by reason.

Requests are built with recserve's own copy of TF Serving's messages (no TensorFlow needed);
tests/server/test_server_tfserving_grpc.py checks the whole answer through a real server
with TensorFlow's stubs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from recserve import Processor
from recserve.errors import RequestError
from recserve.export.demo import DemoModel
from recserve.export.reference import Reference
from recserve.processor.trace import RequestTrace
from recserve.proto import tfserving_pb2 as pb
from recserve.wire import codec
from recserve.wire import tfserving_codec as tfs

pytestmark = pytest.mark.skipif(codec._native is None, reason="routes need the native parser (RECSERVE_PURE_PYTHON=1)")

_DTYPE = {np.dtype(np.float32): pb.DT_FLOAT, np.dtype(np.float64): pb.DT_DOUBLE, np.dtype(np.int32): pb.DT_INT32,
          np.dtype(np.int64): pb.DT_INT64, np.dtype(np.bool_): pb.DT_BOOL, np.dtype(object): pb.DT_STRING,
          np.dtype(np.float16): pb.DT_HALF}
_FIELD = {pb.DT_FLOAT: "float_val", pb.DT_DOUBLE: "double_val", pb.DT_INT32: "int_val", pb.DT_INT64: "int64_val",
          pb.DT_BOOL: "bool_val", pb.DT_STRING: "string_val", pb.DT_HALF: "half_val"}


def _tensor(value: np.ndarray, form: str, rng: np.random.Generator) -> tuple[pb.TensorProto, np.ndarray]:
    """`value` as a TensorProto in `form` -- "content" (tensor_content), "val" (the dtype's
    *_val field, every element) or "fill" (*_val holding a prefix: the last value repeats,
    or zeros when it is empty) -- and the array TensorFlow reads from it."""
    dtype = _DTYPE[value.dtype]
    proto = pb.TensorProto(dtype=dtype)
    for d in value.shape:
        proto.tensor_shape.dim.add(size=d)
    flat = value.reshape(-1)
    if form == "content":
        proto.tensor_content = flat.astype(flat.dtype.newbyteorder("<")).tobytes()
        return proto, value
    have = len(flat) if form == "val" else int(rng.integers(0, len(flat) + 1))
    given = flat[:have]
    if dtype == pb.DT_HALF:
        proto.half_val.extend(given.view(np.uint16).tolist())
    else:
        getattr(proto, _FIELD[dtype]).extend(given.tolist())
    tail = given[-1] if have else (b"" if value.dtype == object else value.dtype.type(0))
    read = np.empty_like(flat)
    read[:have] = given
    read[have:] = tail
    return proto, read.reshape(value.shape)


def _request(inputs: dict[str, tuple[pb.TensorProto, np.ndarray]], output_filter: tuple[str, ...] = (),
             signature: str = "") -> bytes:
    request = pb.PredictRequest()
    request.model_spec.name = "m"
    request.model_spec.signature_name = signature
    for name, (proto, _) in inputs.items():
        request.inputs[name].CopyFrom(proto)
    request.output_filter.extend(output_filter)
    return request.SerializeToString()


def _python_route(processor: Processor, data: bytes) -> bytes:
    """The spec: the generated parser's inputs served the general Python way, encoded by
    tfserving_codec (what the gRPC handler answers before its model_spec)."""
    call = tfs.decode_predict_request(data)
    return tfs.encode_predict_outputs(processor.serve(None, call.decoded, RequestTrace()))


def _counters(processor: Processor) -> dict[str, int]:
    route = processor.model_info()["native_route"]
    return {"served": route["served"], **route["fallbacks"]}


def _native(processor: Processor, data: bytes) -> tuple[bytes | None, dict[str, int]]:
    """The native answer to `data` after its layout's first request registered its route,
    and how the counters moved for it."""
    call = tfs.parse_predict_request(data)
    processor.serve(call.parsed, call.decoded, RequestTrace())   # the handler's Python path: registers the route
    before = _counters(processor)
    trace = RequestTrace()
    got = processor.process_tfs(data, trace)
    after = _counters(processor)
    if got is not None:
        assert trace.model_version == processor.model_info()["version"]
        assert trace.batch_size >= 1 and [s[0] for s in trace.spans] == ["decode", "lookup", "run", "encode"]
    return got, {k: after[k] - before[k] for k in after if after[k] != before[k]}


def _outputs(response: bytes) -> dict[str, np.ndarray]:
    message = pb.PredictResponse.FromString(response)
    return {k: tfs.tensor_to_array(k, v) for k, v in message.outputs.items()}


# --- every dtype: a model of dense inputs only, checked against ONNX Runtime itself ----------

def _dtype_model(path: Path) -> None:
    inputs = [helper.make_tensor_value_info("f", TensorProto.FLOAT, ["batch", 2]),
              helper.make_tensor_value_info("d", TensorProto.DOUBLE, ["batch"]),
              helper.make_tensor_value_info("i", TensorProto.INT32, ["batch"]),
              helper.make_tensor_value_info("l", TensorProto.INT64, ["batch"]),
              helper.make_tensor_value_info("b", TensorProto.BOOL, ["batch"]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, [])]
    nodes = [helper.make_node("Mul", ["f", "k"], ["f_out"]), helper.make_node("Not", ["b"], ["b_out"]),
             helper.make_node("Neg", ["d"], ["d_out"]), helper.make_node("Identity", ["i"], ["i_out"]),
             helper.make_node("Identity", ["l"], ["l_out"]), helper.make_node("Identity", ["k"], ["total"])]
    # (Elementwise only: a reduction's float sum may round differently in one ULP between two
    # ONNX Runtime sessions fed differently aligned buffers.)
    outputs = [helper.make_tensor_value_info("f_out", TensorProto.FLOAT, ["batch", 2]),
               helper.make_tensor_value_info("b_out", TensorProto.BOOL, ["batch"]),
               helper.make_tensor_value_info("d_out", TensorProto.DOUBLE, ["batch"]),
               helper.make_tensor_value_info("i_out", TensorProto.INT32, ["batch"]),
               helper.make_tensor_value_info("l_out", TensorProto.INT64, ["batch"]),
               helper.make_tensor_value_info("total", TensorProto.FLOAT, [])]
    model = helper.make_model(helper.make_graph(nodes, "dtypes", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path.mkdir(parents=True)
    onnx.save(model, str(path / "model.onnx"))


@pytest.fixture(scope="module")
def dtype_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Processor, ort.InferenceSession]]:
    path = tmp_path_factory.mktemp("tfs-dtypes") / "model"
    _dtype_model(path)
    processor = Processor({"model_store_type": "local", "savedmodel_dir": str(path),
                           "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1})
    yield processor, ort.InferenceSession(str(path / "model.onnx"), providers=["CPUExecutionProvider"])
    processor.close()


def _dtype_inputs(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"f": rng.standard_normal((batch, 2)).astype(np.float32),
            "d": rng.standard_normal(batch),
            "i": rng.integers(-2**31, 2**31, batch, dtype=np.int64).astype(np.int32),
            "l": rng.integers(-2**63, 2**63 - 1, batch, dtype=np.int64),
            "b": rng.random(batch) < 0.5,
            "k": np.array(rng.standard_normal(), np.float32)}


OUTPUTS = ("f_out", "b_out", "d_out", "i_out", "l_out", "total")


def test_every_dtype_and_form_is_native_byte_for_byte(dtype_model) -> None:
    processor, session = dtype_model
    assert processor.model_info()["native_route"]["enabled"]
    rng = np.random.default_rng(24)
    for n in range(120):
        batch = int(rng.integers(1, 40)) if n % 10 else 64
        forms = ("content", "val", "fill")
        tensors = {name: _tensor(value, forms[int(rng.integers(0, 3))], rng)
                   for name, value in _dtype_inputs(batch, rng).items()}
        output_filter = () if n % 3 == 0 else tuple(rng.permutation(OUTPUTS)[:int(rng.integers(1, 7))].tolist())
        data = _request(tensors, output_filter, signature=("", "serving_default")[n % 2])
        want = _python_route(processor, data)
        got, moved = _native(processor, data)
        assert moved == {"served": 1}, (n, moved)
        assert got == want, n
        # The predictions: ONNX Runtime run directly on the arrays TensorFlow reads.
        names = list(output_filter or OUTPUTS)
        direct = dict(zip(names, session.run(names, {k: read for k, (_, read) in tensors.items()})))
        answer = _outputs(got)
        assert sorted(answer) == sorted(names)   # (a parsed map's order is upb's)
        for name in names:
            assert answer[name].dtype == direct[name].dtype and answer[name].shape == direct[name].shape, name
            assert answer[name].tobytes() == direct[name].tobytes(), name


def test_forms_the_c_parser_declines_fall_back_with_the_same_answer(dtype_model) -> None:
    processor, _ = dtype_model
    rng = np.random.default_rng(5)
    inputs = _dtype_inputs(3, rng)
    tensors = {name: _tensor(value, "content", rng) for name, value in inputs.items()}
    # float16 values for a float input: DT_HALF has no native reader (RS_CODEC_FALLBACK).
    half = dict(tensors, f=_tensor(inputs["f"].astype(np.float16), "val", rng))
    # int_val holding more values than the shape: TensorFlow ignores the rest, C declines.
    extra, _ = _tensor(inputs["i"], "val", rng)
    extra.int_val.append(7)
    # a value in a field that is not the dtype's own
    stray, _ = _tensor(inputs["l"], "val", rng)
    stray.int_val.append(1)
    for changed in (half, dict(tensors, i=(extra, inputs["i"])), dict(tensors, l=(stray, inputs["l"]))):
        data = _request(changed)
        want = _python_route(processor, data)
        before = _counters(processor)
        got = processor.process_tfs(data, RequestTrace())
        after = _counters(processor)
        assert got is None
        assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"parse": 1}
        call = tfs.parse_predict_request(data)   # the handler's fallback: the same answer
        assert tfs.encode_predict_outputs(processor.serve(call.parsed, call.decoded, RequestTrace())) == want


def test_a_layout_first_seen_is_a_route_miss_then_native(dtype_model) -> None:
    processor, _ = dtype_model
    rng = np.random.default_rng(9)
    data = _request({name: _tensor(value, "val", rng) for name, value in _dtype_inputs(77, rng).items()},
                    ("total", "i_out"))
    before = _counters(processor)
    assert processor.process_tfs(data, RequestTrace()) is None
    after = _counters(processor)
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"route_miss": 1}
    got, moved = _native(processor, data)
    assert moved == {"served": 1} and got == _python_route(processor, data)


def test_bad_requests_are_left_to_python(dtype_model) -> None:
    processor, _ = dtype_model
    rng = np.random.default_rng(2)
    tensors = {name: _tensor(value, "content", rng) for name, value in _dtype_inputs(2, rng).items()}
    short = pb.TensorProto()
    short.CopyFrom(tensors["f"][0])
    short.tensor_content = short.tensor_content[:-1]
    for data in (b"\xff\xff\xff", b"\x0a\x80", _request(dict(tensors, f=(short, None)))):
        assert processor.process_tfs(data, RequestTrace()) is None
    # The handler's fallback names what is wrong, as before.
    with pytest.raises(RequestError) as caught:
        tfs.parse_predict_request(_request(dict(tensors, f=(short, None)))).decoded()
    assert caught.value.message == ("tensor parsing error: f: tensor_content has 15 bytes; tensor_shape [2, 2] "
                                    "of DT_FLOAT needs 16")
    with pytest.raises(RequestError, match="request is not a valid tensorflow.serving.PredictRequest"):
        tfs.parse_predict_request(b"\x0a\x80")


def _entry_sizes(response: bytes) -> set[int]:
    """The byte sizes of a PredictResponse's top-level fields (its output entries)."""
    sizes, at = set(), 0
    while at < len(response):
        at += 1   # the tag: one byte for fields 1 and 2
        size = shift = 0
        while True:
            byte = response[at]
            at += 1
            size |= (byte & 0x7F) << shift
            shift += 7
            if byte < 0x80:
                break
        sizes.add(size)
        at += size
    return sizes


def test_eas_entries_of_every_size_are_native_byte_for_byte(dtype_model, monkeypatch: pytest.MonkeyPatch) -> None:
    """The encoder both entries share, on output entries of 100 to 160 bytes: an entry of
    exactly 127 once had its length written in one byte where the entry's total needs two
    (the response was corrupt)."""
    processor, _ = dtype_model
    rng = np.random.default_rng(127)
    sizes: set[int] = set()
    for n in range(300):
        batch = int(rng.integers(8, 16))
        inputs = _dtype_inputs(batch, rng)
        inputs["l"] = inputs["l"] >> rng.integers(0, 63, batch)   # varints of every width
        data = codec.encode_request(inputs, output_filter=["l_out"])
        with monkeypatch.context() as m:
            m.setattr(codec, "_native_parse", None)
            want = processor.process_python(data)
        processor.process(data)   # registers the layout's route
        served = processor.model_info()["native_route"]["served"]
        assert processor.process(data) == want, n
        assert processor.model_info()["native_route"]["served"] == served + 1
        sizes |= _entry_sizes(want[1])
    assert 127 in sizes and {126, 128} <= sizes


# --- the demo model: embedding lookups, string ids, unknown ids ------------------------------

def test_the_demo_model_is_native_and_answers_like_the_reference(processor: Processor, demo: DemoModel) -> None:
    reference = Reference(demo.model_dir, demo.version_dir)
    rng = np.random.default_rng(36)
    for n in range(40):
        batch = (1, 2, 3, 17, 64)[n % 5]
        inputs = demo.sample_inputs(batch, rng)
        if n % 4 == 1:
            inputs["user_id"] = inputs["user_id"].astype(np.int32)   # ids of another integer dtype
        tensors = {}
        for name, value in inputs.items():
            form = "val" if value.dtype in (np.dtype(object), np.dtype(np.bool_)) else ("content", "val")[n % 2]
            tensors[name] = _tensor(value, "fill" if n % 7 == 3 and value.dtype != object else form, rng)
        output_filter = ((), ("probabilities",), ("logits", "probabilities"))[n % 3]
        data = _request(tensors, output_filter)
        want = _python_route(processor, data)
        got, moved = _native(processor, data)
        assert moved == {"served": 1}, (n, moved)
        assert got == want, n
        expected = reference.predict({k: read for k, (_, read) in tensors.items()})
        answer = _outputs(got)
        assert set(answer) == set(output_filter or expected)
        for name, value in answer.items():
            np.testing.assert_allclose(value, expected[name], atol=1e-6, rtol=0, err_msg=name)
