"""TF Serving's gRPC API on a real `recserve serve` subprocess, called with
tensorflow-serving-api's own stubs and TensorFlow's own `make_tensor_proto` /
`make_ndarray`, compared with `Processor.predict` in this process.

TensorFlow and tensorflow-serving-api register `tensorflow.*` messages in protobuf's default
pool; recserve's copies are `recserve.tfs.*`, so both load in one process (this module
imports recserve.wire.tfserving_codec; test_both_protos_load_with_the_server checks the
whole server in a fresh interpreter, as this pytest process also holds tritonclient's
`inference.*`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
tf = pytest.importorskip("tensorflow")
apis = pytest.importorskip("tensorflow_serving.apis.predict_pb2")  # installed by `make install` (--no-deps)

from tensorflow.core.framework import tensor_pb2, tensor_shape_pb2, types_pb2
from tensorflow_serving.apis import (
    classification_pb2,
    get_model_metadata_pb2,
    get_model_status_pb2,
    model_management_pb2,
    model_pb2,
    model_service_pb2_grpc,
    predict_pb2,
    prediction_service_pb2_grpc,
)

from recserve import Processor
from recserve.processor.trace import RequestTrace
from recserve.wire import tfserving_codec as tfs
from tests.server.conftest import ROOT, start_server

# --- a plain ONNX model with an input of every dtype recserve serves, and a scalar ----------

DTYPES = {"f": TensorProto.FLOAT, "d": TensorProto.DOUBLE, "i": TensorProto.INT32, "l": TensorProto.INT64,
          "b": TensorProto.BOOL, "s": TensorProto.STRING}
NUMPY = {"f": np.float32, "d": np.float64, "i": np.int32, "l": np.int64, "b": np.bool_, "s": object}


def _plain_model(path: Path) -> None:
    inputs = [helper.make_tensor_value_info("f", TensorProto.FLOAT, ["batch", 2])]
    inputs += [helper.make_tensor_value_info(k, t, ["batch"]) for k, t in DTYPES.items() if k != "f"]
    inputs.append(helper.make_tensor_value_info("k", TensorProto.FLOAT, []))
    nodes = [helper.make_node("Mul", ["f", "k"], ["f_out"]), helper.make_node("Not", ["b"], ["b_out"])]
    nodes += [helper.make_node("Identity", [k], [f"{k}_out"]) for k in "dils"]
    outputs = [helper.make_tensor_value_info("f_out", TensorProto.FLOAT, ["batch", 2])]
    outputs += [helper.make_tensor_value_info(f"{k}_out", t, ["batch"]) for k, t in DTYPES.items() if k != "f"]
    graph = helper.make_graph(nodes, "dtypes", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    path.mkdir(parents=True)
    onnx.save(model, str(path / "model.onnx"))


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfs-plain")
    _plain_model(root / "model")
    return {"model_store_type": "local", "savedmodel_dir": str(root / "model"),
            "intra_op_parallelism_threads": 1, "inter_op_parallelism_threads": 1}


@pytest.fixture(scope="module")
def plain_processor(plain):
    processor = Processor(plain)
    yield processor
    processor.close()


@pytest.fixture(scope="module")
def plain_servers(plain, tmp_path_factory):
    """The plain model served natively and with the pure-Python decoder (the twin)."""
    root = tmp_path_factory.mktemp("tfs-plain-servers")
    path = root / "config.json"
    path.write_text(json.dumps(plain))
    servers = [start_server(path, root), start_server(path, root, env={"RECSERVE_PURE_PYTHON": "1"})]
    yield servers
    for s in servers:
        s.stop()


def _inputs(batch: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "f": rng.standard_normal((batch, 2)).astype(np.float32),
        "d": rng.standard_normal(batch),
        "i": rng.integers(-2**31, 2**31, batch, dtype=np.int64).astype(np.int32),
        "l": rng.integers(-2**62, 2**62, batch, dtype=np.int64),
        "b": rng.random(batch) < 0.5,
        "s": np.array([f"s{j}-é".encode() for j in rng.integers(0, 1000, batch)], dtype=object),
        "k": np.array(1.5, np.float32),
    }


def _request(inputs, name="default", signature="", output_filter=(), version=None, label=None):
    request = predict_pb2.PredictRequest()
    request.model_spec.name = name
    request.model_spec.signature_name = signature
    if version is not None:
        request.model_spec.version.value = version
    if label is not None:
        request.model_spec.version_label = label
    for key, value in inputs.items():
        request.inputs[key].CopyFrom(value if isinstance(value, tensor_pb2.TensorProto) else tf.make_tensor_proto(value))
    request.output_filter.extend(output_filter)
    return request


def _val_form(value: np.ndarray) -> tensor_pb2.TensorProto:
    """The repeated *_val form of `value` (make_tensor_proto writes tensor_content for numbers)."""
    dtype = tf.as_dtype(value.dtype if value.dtype != object else tf.string).as_datatype_enum
    proto = tensor_pb2.TensorProto(dtype=dtype, tensor_shape=tensor_shape_pb2.TensorShapeProto(
        dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in value.shape]))
    field = {np.float32: "float_val", np.float64: "double_val", np.int32: "int_val", np.int64: "int64_val",
             np.bool_: "bool_val"}.get(value.dtype.type, "string_val")
    getattr(proto, field).extend(value.reshape(-1).tolist())
    return proto


def _outputs(response) -> dict[str, np.ndarray]:
    return {k: tf.make_ndarray(v) for k, v in response.outputs.items()}


def _wire(value: object) -> object:
    # A DT_STRING travels as bytes: ONNX Runtime's str outputs arrive UTF-8 encoded.
    return value.encode() if isinstance(value, str) else value


def _assert_exact(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        assert got[key].dtype == value.dtype and got[key].shape == value.shape, key
        want = [_wire(v) for v in value.reshape(-1).tolist()] if value.dtype == object else value.tolist()
        assert (got[key].reshape(-1).tolist() if value.dtype == object else got[key].tolist()) == want, key


@pytest.fixture(scope="module")
def plain_stubs(plain_servers):
    channels = [grpc.insecure_channel(s.grpc_address) for s in plain_servers]
    yield [prediction_service_pb2_grpc.PredictionServiceStub(c) for c in channels]
    for c in channels:
        c.close()


def test_every_dtype_and_form_equals_processor_predict(plain_stubs, plain_processor):
    """tensor_content (make_tensor_proto), *_val fields, a scalar, a broadcast value, and a
    tensor with no values (zeros), through the native parser and its Python twin."""
    rng = np.random.default_rng(3)
    for batch in (1, 5):
        inputs = _inputs(batch, rng)
        expected = plain_processor.predict(inputs)
        forms = {
            "make_tensor_proto": {k: tf.make_tensor_proto(v) for k, v in inputs.items()},
            "_val": {k: _val_form(v) for k, v in inputs.items()},
        }
        for stub in plain_stubs:
            for form, protos in forms.items():
                response = stub.Predict(_request(protos), timeout=30)
                _assert_exact(_outputs(response), expected)
                assert response.model_spec.name == "default", form
                assert response.model_spec.signature_name == "serving_default"
    # One value repeats to the shape's elements; no values make zeros (Tensor::FromProto).
    broadcast = {"f": np.full((3, 2), 0.25, np.float32), "d": np.full(3, -2.5), "i": np.full(3, 7, np.int32),
                 "l": np.full(3, 2**40, np.int64), "b": np.full(3, True), "s": np.array([b"x"] * 3, dtype=object),
                 "k": np.array(2.0, np.float32)}
    protos = {k: tf.make_tensor_proto(v.reshape(-1)[0], dtype=tf.as_dtype(v.dtype if v.dtype != object else tf.string),
                                      shape=list(v.shape)) for k, v in broadcast.items()}
    zeros = {k: tensor_pb2.TensorProto(dtype=p.dtype, tensor_shape=p.tensor_shape) for k, p in protos.items()}
    zero_inputs = {k: np.zeros_like(v) if v.dtype != object else np.array([b""] * 3, dtype=object)
                   for k, v in broadcast.items()}
    for stub in plain_stubs:
        _assert_exact(_outputs(stub.Predict(_request(protos), timeout=30)), plain_processor.predict(broadcast))
        _assert_exact(_outputs(stub.Predict(_request(zeros), timeout=30)), plain_processor.predict(zero_inputs))


def test_output_filter_and_wire_form(plain_stubs, plain_processor):
    inputs = _inputs(4, np.random.default_rng(4))
    response = plain_stubs[0].Predict(_request(inputs, output_filter=["f_out", "s_out"]), timeout=30)
    assert sorted(response.outputs) == ["f_out", "s_out"]
    f_out = response.outputs["f_out"]
    # As TF Serving answers by default (Tensor::AsProtoField): values in float_val, no tensor_content.
    assert f_out.dtype == types_pb2.DT_FLOAT and not f_out.tensor_content
    assert [d.size for d in f_out.tensor_shape.dim] == [4, 2]
    assert list(f_out.float_val) == plain_processor.predict(inputs, ["f_out"])["f_out"].reshape(-1).tolist()


def test_plain_model_metadata(plain_stubs):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "default"
    response = plain_stubs[0].GetModelMetadata(request, timeout=30)
    assert response.model_spec.name == "default" and response.model_spec.version.value == 0
    any_ = response.metadata["signature_def"]
    assert any_.type_url == "type.googleapis.com/tensorflow.serving.SignatureDefMap"
    defs = get_model_metadata_pb2.SignatureDefMap()
    assert any_.Unpack(defs)
    sig = defs.signature_def["serving_default"]
    assert sig.method_name == "tensorflow/serving/predict"
    assert sig.inputs["f"].dtype == types_pb2.DT_FLOAT and sig.inputs["f"].name == "f"
    assert [d.size for d in sig.inputs["f"].tensor_shape.dim] == [-1, 2]
    assert sig.inputs["s"].dtype == types_pb2.DT_STRING and sig.inputs["b"].dtype == types_pb2.DT_BOOL
    assert sig.inputs["k"].tensor_shape.dim == [] and not sig.inputs["k"].tensor_shape.unknown_rank
    assert sig.outputs["l_out"].dtype == types_pb2.DT_INT64


# --- the demo model (embeddings, versions) ------------------------------------------------------

@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc_address) as ch:
        yield ch


@pytest.fixture(scope="module")
def stub(channel):
    return prediction_service_pb2_grpc.PredictionServiceStub(channel)


@pytest.fixture(scope="module")
def model_stub(channel):
    return model_service_pb2_grpc.ModelServiceStub(channel)


def _metric(server, name: str, **labels: str) -> float:
    import httpx
    total = 0.0
    for line in httpx.get(server.url + "/metrics", timeout=30).text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_demo_predict_equals_processor(stub, server, demo, demo_processor):
    answered = _metric(server, "recserve_requests_total", route="tfserving_grpc", code="200", model="default")
    cpu = _metric(server, "recserve_request_cpu_seconds_total", route="tfserving_grpc", model="default")
    for batch in (1, 64):
        inputs = demo.sample_inputs(batch, np.random.default_rng(batch))
        expected = demo_processor.predict(inputs)
        response = stub.Predict(_request(inputs), timeout=30)
        _assert_exact(_outputs(response), expected)
        assert response.model_spec.version.value == 1
        # The serving version, by number or by label (its name).
        for named in (_request(inputs, version=1), _request(inputs, label="1")):
            _assert_exact(_outputs(stub.Predict(named, timeout=30)), expected)
    # The per-request metrics, on the protocol's own route label.
    assert _metric(server, "recserve_requests_total", route="tfserving_grpc", code="200",
                   model="default") - answered == 6
    assert _metric(server, "recserve_request_cpu_seconds_total", route="tfserving_grpc", model="default") > cpu


def _python_answer(processor, data: bytes, version: int = 1, signature: str = "serving_default") -> bytes:
    """What the Python route answers `data` (the generated parser, the general path)."""
    call = tfs.decode_predict_request(data)
    outputs = processor.serve(None, call.decoded, RequestTrace())
    return tfs.encode_predict_outputs(outputs) + tfs.model_spec_field("default", version, signature)


def test_demo_predict_is_native_byte_for_byte(channel, stub, server, demo, demo_processor):
    """After a layout's first request, the server answers it on the native route: the same
    bytes as the Python route, to a raw call and to TensorFlow's stub, counted as native."""
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    rng = np.random.default_rng(36)
    native = fallbacks = 0.0
    for n, batch in enumerate((1, 2, 7, 64, 1, 64)):
        inputs = demo.sample_inputs(batch, rng)
        if n % 2:   # the *_val form, and a version named
            request = _request({k: _val_form(v) for k, v in inputs.items()}, version=1)
        else:
            request = _request(inputs, signature="serving_default", output_filter=["probabilities"][:n % 4])
        data = request.SerializeToString()
        want = _python_answer(demo_processor, data)
        raw(data, timeout=30)   # a new layout: validated and registered by the Python route
        native = _metric(server, "recserve_native_route_requests_total", model="default")
        fallbacks = _metric(server, "recserve_native_route_fallbacks_total", model="default")
        assert raw(data, timeout=30) == want
        response, call = stub.Predict.with_call(request, timeout=30)
        assert response == predict_pb2.PredictResponse.FromString(want)
        assert ("x-recserve-model-version", "1") in call.trailing_metadata()
        _assert_exact(_outputs(response), demo_processor.predict(inputs, request.output_filter or None))
        assert _metric(server, "recserve_native_route_requests_total", model="default") - native == 2
        assert _metric(server, "recserve_native_route_fallbacks_total", model="default") == fallbacks
    # The checks the handler keeps on a native answer: the version and the label.
    version = _error(raw, _request(inputs, version=7).SerializeToString())
    assert version.code() == grpc.StatusCode.NOT_FOUND
    assert version.details().startswith("Servable not found for request: Specific(default, 7)")
    label = _error(stub.Predict, _request(inputs, label="canary"))
    assert label.code() == grpc.StatusCode.NOT_FOUND and "'canary'" in label.details()
    # A second model_spec merges into the first (protobuf's rule): the merged name decides.
    merged = _error(raw, _request(inputs).SerializeToString() + b"\x0a\x07\x0a\x05other")
    assert merged.code() == grpc.StatusCode.NOT_FOUND
    assert merged.details() == "unknown model 'other'; this server serves ['default']"
    # A form the C parser declines (float16 values): the Python route's answer, counted.
    half = dict(inputs, age=inputs["age"].astype(np.float16))
    data = _request(half).SerializeToString()
    before = _metric(server, "recserve_native_route_fallbacks_total", model="default", reason="parse")
    assert raw(data, timeout=30) == _python_answer(demo_processor, data)
    assert _metric(server, "recserve_native_route_fallbacks_total", model="default", reason="parse") == before + 1


def _error(call, request) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=30)
    return caught.value


def test_demo_errors(stub, demo):
    inputs = demo.sample_inputs(2, np.random.default_rng(5))
    unknown = _error(stub.Predict, _request(inputs, name="other"))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    assert unknown.details() == "unknown model 'other'; this server serves ['default']"
    version = _error(stub.Predict, _request(inputs, version=7))
    assert version.code() == grpc.StatusCode.NOT_FOUND
    assert version.details().startswith("Servable not found for request: Specific(default, 7): model 'default' "
                                        "serves version 1")
    label = _error(stub.Predict, _request(inputs, label="canary"))
    assert label.code() == grpc.StatusCode.NOT_FOUND and "'canary'" in label.details()
    bogus = _error(stub.Predict, _request({**inputs, "bogus": np.zeros(2, np.int64)}))
    assert bogus.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bogus.details().startswith("unknown input 'bogus' for signature 'serving_default'")
    missing = _error(stub.Predict, _request({k: v for k, v in inputs.items() if k != "age"}))
    assert missing.code() == grpc.StatusCode.INVALID_ARGUMENT and "'age'" in missing.details()
    signature = _error(stub.Predict, _request(inputs, signature="nope"))
    assert signature.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert signature.details() == "unknown signature_name 'nope'; this model has ['serving_default']"
    flt = _error(stub.Predict, _request(inputs, output_filter=["nope"]))
    assert flt.code() == grpc.StatusCode.INVALID_ARGUMENT and "'nope'" in flt.details()
    # A tensor TensorFlow cannot parse: tensor_content of the wrong length, a negative dimension.
    short = tf.make_tensor_proto(inputs["age"])
    short.tensor_content = short.tensor_content[:-1]
    bad = _error(stub.Predict, _request({**inputs, "age": short}))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.details() == ("tensor parsing error: age: tensor_content has 7 bytes; tensor_shape [2, 1] of "
                             "DT_FLOAT needs 8")
    negative = tf.make_tensor_proto(inputs["age"])
    negative.tensor_shape.dim[0].size = -2
    bad = _error(stub.Predict, _request({**inputs, "age": negative}))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT and "negative dimension" in bad.details()
    half = tf.make_tensor_proto(inputs["age"].astype(np.complex64))
    bad = _error(stub.Predict, _request({**inputs, "age": half}))
    assert bad.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.details().startswith("tensor parsing error: age: dtype DT_COMPLEX64 is not supported; supported: ")
    nameless = _error(stub.Predict, predict_pb2.PredictRequest())
    assert nameless.code() == grpc.StatusCode.NOT_FOUND   # no model name: TF Serving's answer too


def test_malformed_bytes(channel):
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
    for data in (b"\xff\xff\xff", b"\x12\x05\x0a\x01x", b"\x0a\x80"):
        error = _error(raw, data)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert error.details().startswith("request is not a valid tensorflow.serving.PredictRequest")


def test_unimplemented_methods(channel, stub, model_stub):
    calls = [stub.Classify] + [channel.unary_unary(f"/tensorflow.serving.PredictionService/{m}")
                               for m in ("Regress", "MultiInference")]
    for call in calls:
        request = classification_pb2.ClassificationRequest() if call is stub.Classify else b""
        error = _error(call, request)
        assert error.code() == grpc.StatusCode.UNIMPLEMENTED
        assert "recserve serves tensorflow.serving.PredictionService's Predict and GetModelMetadata" in error.details()
    reload_ = _error(model_stub.HandleReloadConfigRequest, model_management_pb2.ReloadConfigRequest())
    assert reload_.code() == grpc.StatusCode.UNIMPLEMENTED


def test_demo_metadata_and_status(stub, model_stub, demo_processor):
    request = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    request.model_spec.name = "default"
    response = stub.GetModelMetadata(request, timeout=30)
    assert response.model_spec.version.value == 1
    defs = get_model_metadata_pb2.SignatureDefMap()
    response.metadata["signature_def"].Unpack(defs)
    expected = demo_processor.signature_info()
    sig = defs.signature_def["serving_default"]
    assert sorted(sig.inputs) == sorted(expected["inputs"]) and sorted(sig.outputs) == sorted(expected["outputs"])
    clicked = sig.inputs["clicked_items"]
    assert clicked.dtype == types_pb2.DT_INT64 and [d.size for d in clicked.tensor_shape.dim] == [-1, -1]
    no_field = get_model_metadata_pb2.GetModelMetadataRequest()
    no_field.model_spec.name = "default"
    assert _error(stub.GetModelMetadata, no_field).code() == grpc.StatusCode.INVALID_ARGUMENT
    other = get_model_metadata_pb2.GetModelMetadataRequest(metadata_field=["signature_def"])
    other.model_spec.name = "other"
    assert _error(stub.GetModelMetadata, other).code() == grpc.StatusCode.NOT_FOUND

    status_request = get_model_status_pb2.GetModelStatusRequest()
    status_request.model_spec.name = "default"
    status = model_stub.GetModelStatus(status_request, timeout=30)
    assert len(status.model_version_status) == 1
    row = status.model_version_status[0]
    assert row.version == 1 and row.state == get_model_status_pb2.ModelVersionStatus.AVAILABLE
    assert row.status.error_code == 0 and row.status.error_message == ""
    status_request.model_spec.version.value = 3
    missing = _error(model_stub.GetModelStatus, status_request)
    assert missing.code() == grpc.StatusCode.NOT_FOUND
    assert missing.details() == "Could not find version 3 of model 'default'; it has [1]"


def test_both_protos_load_with_the_server():
    """TensorFlow's and tensorflow-serving-api's messages and recserve's whole gRPC server
    in one fresh interpreter: no duplicate symbol in protobuf's default pool."""
    code = ("import tensorflow, tensorflow_serving.apis.prediction_service_pb2_grpc, "
            "tensorflow_serving.apis.get_model_status_pb2\n"
            "import recserve.server.grpc_services, recserve.proto.tfserving_pb2 as r\n"
            "print(r.TensorProto.DESCRIPTOR.full_name)")
    done = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "recserve.tfs.TensorProto"


# --- several models: loading, versions, a pinned version; worker processes ------------------

ADMIN_TOKEN = "tfs-admin-token"


def test_loading_model_and_pinned_version(launch, tmp_path, demo, demo_processor):
    from recserve.export.demo import write_demo
    from tests.server.test_server_models import _second_version

    ranker = write_demo(tmp_path / "ranker")
    _second_version(ranker.checkpoint_dir)
    recall = write_demo(tmp_path / "recall")
    empty = tmp_path / "recall-checkpoints"
    empty.mkdir()
    running = launch({"models": [
        {"name": "ranker", "model_config": ranker.config()},
        {"name": "recall", "model_config": recall.config() | {"checkpoint_dir": str(empty),
                                                              "model_update_interval_seconds": 0.2}}]},
        env={"RECSERVE_ADMIN_TOKEN": ADMIN_TOKEN}, wait_ready=False)
    import httpx
    inputs = demo.sample_inputs(3, np.random.default_rng(8))
    with grpc.insecure_channel(running.grpc_address) as ch:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
        status_stub = model_service_pb2_grpc.ModelServiceStub(ch)
        deadline = time.monotonic() + 60
        while httpx.get(f"{running.url}/v2/models/ranker/ready").status_code != 200:
            assert time.monotonic() < deadline, running.log()
            time.sleep(0.1)
        loading = _error(stub.Predict, _request(inputs, name="recall"))
        assert loading.code() == grpc.StatusCode.UNAVAILABLE
        assert loading.details() == "model 'recall' is still loading"
        status = status_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(
            model_spec=model_pb2.ModelSpec(name="recall")), timeout=30)
        assert [(r.version, r.state) for r in status.model_version_status] == [
            (0, get_model_status_pb2.ModelVersionStatus.START)]

        # ranker serves its newest version, 2; version 1 is not loaded.
        newest = stub.Predict(_request(inputs, name="ranker", version=2), timeout=30)
        assert newest.model_spec.version.value == 2
        old = _error(stub.Predict, _request(inputs, name="ranker", version=1))
        assert old.code() == grpc.StatusCode.NOT_FOUND and "serves version 2" in old.details()
        # Pinned to 1: version 1 serves (version 1's answers), 2 is no longer served.
        pinned = httpx.post(f"{running.url}/admin/models/ranker/pin", json={"version": "1"},
                            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60)
        assert pinned.status_code == 200, pinned.text
        response = stub.Predict(_request(inputs, name="ranker", version=1), timeout=30)
        assert response.model_spec.version.value == 1
        _assert_exact(_outputs(response), demo_processor.predict(inputs))
        assert _error(stub.Predict, _request(inputs, name="ranker", version=2)).code() == grpc.StatusCode.NOT_FOUND
        status = status_stub.GetModelStatus(get_model_status_pb2.GetModelStatusRequest(
            model_spec=model_pb2.ModelSpec(name="ranker")), timeout=30)
        assert [(r.version, r.state) for r in status.model_version_status] == [
            (1, get_model_status_pb2.ModelVersionStatus.AVAILABLE)]


def test_worker_processes_and_the_message_limit(launch, demo, demo_processor):
    running = launch(demo.config(), workers=2, env={"RECSERVE_MAX_REQUEST_BYTES": "65536"})
    with grpc.insecure_channel(running.grpc_address) as ch:
        big = demo.sample_inputs(2048, np.random.default_rng(2))   # ~100 KB as TensorProtos
        too_big = _error(prediction_service_pb2_grpc.PredictionServiceStub(ch).Predict, _request(big))
        assert too_big.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for batch in (1, 16):
        inputs = demo.sample_inputs(batch, np.random.default_rng(40 + batch))
        for _ in range(4):   # a connection each: the kernel spreads them over the workers (SO_REUSEPORT)
            with grpc.insecure_channel(running.grpc_address) as ch:
                stub = prediction_service_pb2_grpc.PredictionServiceStub(ch)
                _assert_exact(_outputs(stub.Predict(_request(inputs), timeout=30)), demo_processor.predict(inputs))
