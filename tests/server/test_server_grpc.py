"""The gRPC services of a real `recserve serve` subprocess: tensorflow.eas
PredictionService through the generated stubs, KServe v2 through tritonclient.grpc, and
grpc.health.v1, compared with `Processor.predict` in this process.

This module must not import recserve.proto.grpc_predict_v2_pb2: tritonclient.grpc
registers the same `inference.*` messages in protobuf's default pool."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from recserve.proto import eas_service_pb2, eas_service_pb2_grpc, predict_pb2
from recserve.wire.codec import decode_response, encode_request

V2_TYPES = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32", np.dtype(object): "BYTES"}


@pytest.fixture(scope="module")
def channel(server):
    with grpc.insecure_channel(server.grpc_address) as ch:
        yield ch


def test_eas_predict_over_grpc(channel, demo, demo_processor):
    inputs = demo.sample_inputs(8, np.random.default_rng(11))
    stub = eas_service_pb2_grpc.PredictionServiceStub(channel)
    request = predict_pb2.PredictRequest.FromString(encode_request(inputs, output_filter=["logits"]))
    response = stub.Predict(request, timeout=10)
    outputs = decode_response(response.SerializeToString())
    np.testing.assert_array_equal(outputs["logits"], demo_processor.predict(inputs, ["logits"])["logits"])
    # The model named in the metadata (optional with one model).
    named = stub.Predict(request, metadata=[("model", "default")], timeout=10)
    assert named == response


def test_eas_grpc_errors_and_model_info(channel, demo):
    stub = eas_service_pb2_grpc.PredictionServiceStub(channel)
    inputs = demo.sample_inputs(2, np.random.default_rng(1))
    inputs["bogus"] = np.zeros(2, np.int64)
    with pytest.raises(grpc.RpcError) as bad:
        stub.Predict(predict_pb2.PredictRequest.FromString(encode_request(inputs)), timeout=10)
    assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert bad.value.details().startswith("unknown input 'bogus' for signature 'serving_default'")
    with pytest.raises(grpc.RpcError) as unknown:
        stub.Predict(predict_pb2.PredictRequest(), metadata=[("model", "other")], timeout=10)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert unknown.value.details() == "unknown model 'other'; this server serves ['default']"
    info = stub.GetServingModelInfo(eas_service_pb2.ServingModelInfoRequest(), timeout=10)
    assert info.model_version == "1" and info.global_step == 1
    assert info.signature_name == "serving_default"
    assert info.model_path.endswith("checkpoints")


def _triton_inputs(inputs):
    out = []
    for name, value in inputs.items():
        tensor = triton_grpc.InferInput(name, list(value.shape), V2_TYPES[value.dtype])
        tensor.set_data_from_numpy(value)
        out.append(tensor)
    return out


def test_kserve_grpc_with_tritonclient(server, demo, demo_processor):
    client = triton_grpc.InferenceServerClient(server.grpc_address)
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("default")
    assert not client.is_model_ready("default", model_version="9")
    metadata = client.get_model_metadata("default", as_json=True)
    assert metadata["name"] == "default" and metadata["versions"] == ["1"]
    assert {"name": "clicked_items", "datatype": "INT64", "shape": ["-1", "-1"]} in metadata["inputs"]
    inputs = demo.sample_inputs(32, np.random.default_rng(12))
    expected = demo_processor.predict(inputs)
    result = client.infer("default", _triton_inputs(inputs), request_id="abc")
    assert result.get_response().id == "abc" and result.get_response().model_version == "1"
    for name in ("probabilities", "logits"):
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])
    only = client.infer("default", _triton_inputs(inputs), outputs=[triton_grpc.InferRequestedOutput("logits")])
    assert [o.name for o in only.get_response().outputs] == ["logits"]
    with pytest.raises(InferenceServerException) as bad:
        client.infer("default", _triton_inputs({k: v for k, v in inputs.items() if k != "age"}))
    assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "age" in bad.value.message()


def test_health_check(channel, server):
    stub = health_pb2_grpc.HealthStub(channel)
    for service in ("", "tensorflow.eas.PredictionService", "inference.GRPCInferenceService", "default"):
        response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING
    with pytest.raises(grpc.RpcError) as unknown:
        stub.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


def test_health_watch_streams_the_status(channel, server):
    stub = health_pb2_grpc.HealthStub(channel)
    for service, status in (("", "SERVING"), ("default", "SERVING"), ("nope", "SERVICE_UNKNOWN")):
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)
        assert next(watch).status == health_pb2.HealthCheckResponse.ServingStatus.Value(status)
        watch.cancel()  # a watch lasts until the client leaves
