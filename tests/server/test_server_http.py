"""Every HTTP route of a real `recserve serve` subprocess, called with real clients
(httpx, urllib3 the way DeepRec's EAS client calls, tritonclient.http), each answer
compared with `Processor.predict` on the same model in this process."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_http
import urllib3

from benchmarks.load_tools import tree_cpu_seconds
from recserve.proto import predict_pb2
from recserve.wire.codec import decode_response, encode_request

V2_TYPES = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32", np.dtype(object): "BYTES"}


def _inputs(demo, batch=4, seed=0):
    return demo.sample_inputs(batch, np.random.default_rng(seed))


def _json_value(array: np.ndarray):
    if array.dtype == object:
        return np.vectorize(lambda b: b.decode(), otypes=[object])(array).tolist()
    return array.tolist()


# -- EAS / DeepRec -----------------------------------------------------------------------

def test_eas_protobuf_route_matches_processor(server, demo, demo_processor):
    inputs = _inputs(demo, 8)
    body = encode_request(inputs, output_filter=["probabilities"])
    response = httpx.post(f"{server.url}/api/predict/pttest", content=body)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/octet-stream"
    outputs = decode_response(response.content)
    expected = demo_processor.predict(inputs, ["probabilities"])
    assert list(outputs) == ["probabilities"]
    np.testing.assert_array_equal(outputs["probabilities"], expected["probabilities"])


@pytest.mark.filterwarnings("ignore:URLs without a scheme:FutureWarning")  # as the EAS client calls
def test_eas_client_wire_behaviour(server, demo, demo_processor):
    """What eas_prediction's PredictClient('127.0.0.1:PORT', 'pttest/default') with a
    TFRequest sends: POST http://host/api/predict/pttest/default, the PredictRequest
    bytes as body, Content-Type from its headers (none by default), and with a token an
    'EAS <hmac>' Authorization and Content-MD5 that recserve ignores."""
    inputs = _inputs(demo, 3, seed=5)
    request = predict_pb2.PredictRequest(signature_name="serving_default")
    for name, value in inputs.items():
        proto = request.inputs[name]
        proto.array_shape.dim.extend(value.shape)
        if value.dtype == object:
            proto.dtype = predict_pb2.DT_STRING
            proto.string_val.extend(value.ravel().tolist())
        elif value.dtype == np.int64:
            proto.dtype = predict_pb2.DT_INT64
            proto.int64_val.extend(value.ravel().tolist())
        else:
            proto.dtype = predict_pb2.DT_FLOAT
            proto.float_val.extend(value.ravel().tolist())
    request.output_filter.append("logits")
    body = bytearray(request.SerializeToString())
    pool = urllib3.PoolManager()
    response = pool.request(
        "POST", f"127.0.0.1:{server.http_port}/api/predict/pttest/default", body=body,
        headers={"Authorization": "EAS c2lnbmF0dXJl", "Content-MD5": "0" * 32,
                 "Date": "Mon, 01 Jan 2024 00:00:00 GMT", "Content-Length": str(len(body))},
        timeout=5.0, retries=0,
    )
    assert response.status == 200
    parsed = predict_pb2.PredictResponse.FromString(response.data)
    logits = parsed.outputs["logits"]
    assert list(logits.array_shape.dim) == [3, 1]
    expected = demo_processor.predict(inputs, ["logits"])["logits"]
    np.testing.assert_array_equal(np.array(logits.float_val, np.float32).reshape(3, 1), expected)


def test_eas_empty_body_answers_the_signature(server, demo_processor):
    response = httpx.post(f"{server.url}/api/predict/pttest", content=b"")
    assert response.status_code == 200
    assert response.json() == demo_processor.signature_info()


def test_eas_errors_are_json_with_the_processor_status(server, demo):
    inputs = _inputs(demo, 2)
    inputs["bogus"] = np.array([1, 2], np.int64)
    response = httpx.post(f"{server.url}/api/predict/pttest", content=encode_request(inputs))
    assert response.status_code == 400
    assert response.json() == {"error": (
        "unknown input 'bogus' for signature 'serving_default'; valid inputs are ['age', 'city', "
        "'clicked_items', 'hour', 'item_category', 'item_id', 'price', 'query_category', 'user_id']")}
    garbage = httpx.post(f"{server.url}/api/predict/pttest", content=b"\xff\xff\xff")
    assert garbage.status_code == 400 and "error" in garbage.json()
    unknown = httpx.post(f"{server.url}/api/predict/pttest/nomodel", content=b"x")
    assert unknown.status_code == 404
    assert unknown.json() == {"error": "unknown model 'nomodel'; this server serves ['default']"}


# -- TF Serving REST ---------------------------------------------------------------------

def test_tfserving_columnar_and_row_forms(server, demo, demo_processor):
    inputs = _inputs(demo, 5, seed=2)
    expected = demo_processor.predict(inputs)
    columnar = httpx.post(f"{server.url}/v1/models/default:predict",
                          json={"signature_name": "serving_default",
                                "inputs": {k: _json_value(v) for k, v in inputs.items()}})
    assert columnar.status_code == 200
    outputs = columnar.json()["outputs"]
    assert sorted(outputs) == ["logits", "probabilities"]
    for name in outputs:
        np.testing.assert_array_equal(np.array(outputs[name], np.float32), expected[name])

    # Row form, strings as {"b64": ...} for the first instance.
    rows = []
    for i in range(5):
        row = {k: _json_value(v[i]) if v.ndim > 1 else _json_value(v[i:i + 1])[0] for k, v in inputs.items()}
        rows.append(row)
    rows[0]["city"] = {"b64": base64.b64encode(inputs["city"][0]).decode()}
    by_rows = httpx.post(f"{server.url}/v1/models/default/versions/1:predict", json={"instances": rows})
    assert by_rows.status_code == 200
    predictions = by_rows.json()["predictions"]
    assert len(predictions) == 5
    for i, prediction in enumerate(predictions):
        assert prediction == {k: expected[k][i].tolist() for k in ("logits", "probabilities")}


def test_tfserving_errors(server, demo):
    wrong_version = httpx.post(f"{server.url}/v1/models/default/versions/7:predict", json={"inputs": {}})
    assert wrong_version.status_code == 404
    assert wrong_version.json() == {"error": "model 'default' serves version '1'; version '7' is not loaded"}
    bad_signature = httpx.post(f"{server.url}/v1/models/default:predict",
                               json={"signature_name": "nope", "inputs": {}})
    assert bad_signature.status_code == 400
    assert bad_signature.json() == {"error": "unknown signature_name 'nope'; this model has ['serving_default']"}
    both = httpx.post(f"{server.url}/v1/models/default:predict", json={"inputs": {}, "instances": []})
    assert both.json() == {"error": 'request must have exactly one of "instances" (rows) and "inputs" (columns)'}
    not_json = httpx.post(f"{server.url}/v1/models/default:predict", content=b"{")
    assert not_json.status_code == 400 and not_json.json()["error"].startswith("request body is not valid JSON")
    # json raises RecursionError, not ValueError, on deep nesting: still the client's error.
    deep = httpx.post(f"{server.url}/v1/models/default:predict", content=b"[" * 100_000)
    assert deep.status_code == 400 and deep.json()["error"].startswith("request body is not valid JSON")
    deep_kserve = httpx.post(f"{server.url}/v2/models/default/infer", content=b"[" * 100_000)
    assert deep_kserve.status_code == 400, deep_kserve.text


def test_tfserving_status_and_metadata(server, demo_processor):
    status = httpx.get(f"{server.url}/v1/models/default").json()
    assert status == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}]}
    metadata = httpx.get(f"{server.url}/v1/models/default/metadata").json()
    assert metadata["model_spec"] == {"name": "default", "signature_name": "", "version": "1"}
    sig = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert sig["inputs"]["user_id"] == {
        "dtype": "DT_INT64", "tensor_shape": {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False},
        "name": "user_id"}
    assert sig["inputs"]["city"]["dtype"] == "DT_STRING"
    assert sig["outputs"]["probabilities"]["name"] == "prob"
    assert sorted(sig["inputs"]) == sorted(demo_processor.signature_info()["inputs"])


# -- KServe v2 (tritonclient.http) ----------------------------------------------------------

def _triton_inputs(inputs):
    out = []
    for name, value in inputs.items():
        tensor = triton_http.InferInput(name, list(value.shape), V2_TYPES[value.dtype])
        tensor.set_data_from_numpy(value, binary_data=name != "age")  # one input as JSON
        out.append(tensor)
    return out


def test_kserve_http_with_tritonclient(server, demo, demo_processor):
    client = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("default")
    assert client.get_server_metadata() == {"name": "recserve", "version": "0.1.0", "extensions": ["binary_tensor_data"]}
    metadata = client.get_model_metadata("default")
    assert metadata["versions"] == ["1"]
    assert {"name": "city", "datatype": "BYTES", "shape": [-1]} in metadata["inputs"]
    assert {"name": "probabilities", "datatype": "FP32", "shape": [-1, 1]} in metadata["outputs"]

    inputs = _inputs(demo, 16, seed=3)
    expected = demo_processor.predict(inputs)
    result = client.infer("default", _triton_inputs(inputs), request_id="r1")  # all outputs, binary
    assert result.get_response()["id"] == "r1"
    assert result.get_response()["model_version"] == "1"
    for name in ("probabilities", "logits"):
        np.testing.assert_array_equal(result.as_numpy(name), expected[name])

    as_json = client.infer("default", _triton_inputs(inputs),
                           outputs=[triton_http.InferRequestedOutput("logits", binary_data=False)])
    assert [o["name"] for o in as_json.get_response()["outputs"]] == ["logits"]
    np.testing.assert_allclose(as_json.as_numpy("logits"), expected["logits"], rtol=1e-6)

    compressed = client.infer("default", _triton_inputs(inputs), request_compression_algorithm="gzip",
                              outputs=[triton_http.InferRequestedOutput("probabilities")])
    np.testing.assert_array_equal(compressed.as_numpy("probabilities"), expected["probabilities"])
    index = client.get_model_repository_index()
    assert index == [{"name": "default", "version": "1", "state": "READY"}]


def test_kserve_http_json_only_and_errors(server, demo, demo_processor):
    inputs = _inputs(demo, 2, seed=4)
    body = {"inputs": [{"name": k, "shape": list(v.shape), "datatype": V2_TYPES[v.dtype], "data": _json_value(v)}
                       for k, v in inputs.items()]}
    response = httpx.post(f"{server.url}/v2/models/default/versions/1/infer", json=body)
    assert response.status_code == 200
    doc = response.json()
    expected = demo_processor.predict(inputs)
    assert {o["name"] for o in doc["outputs"]} == {"logits", "probabilities"}
    for out in doc["outputs"]:
        assert out["datatype"] == "FP32" and out["shape"] == [2, 1]
        np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(2, 1), expected[out["name"]])
    body["inputs"][0]["shape"] = [3, 1]
    bad = httpx.post(f"{server.url}/v2/models/default/infer", json=body)
    assert bad.status_code == 400
    assert bad.json() == {"error": f"input {body['inputs'][0]['name']!r}: shape [3, 1] needs 3 values, got 2"}
    unknown = httpx.post(f"{server.url}/v2/models/nomodel/infer", json=body)
    assert unknown.status_code == 404


# -- health, listing, limits, metrics ------------------------------------------------------

def test_health_listing_and_unknown_routes(server):
    assert httpx.get(f"{server.url}/v2/health/live").json() == {"live": True}
    assert httpx.get(f"{server.url}/v2/health/ready").json() == {"ready": True}
    listing = httpx.get(f"{server.url}/models").json()["models"]
    assert [(m["name"], m["state"], m["version"], m["global_step"]) for m in listing] == [("default", "READY", "1", 1)]
    missing = httpx.get(f"{server.url}/nothing/here")
    assert missing.status_code == 404
    assert missing.json() == {"error": "no route GET /nothing/here; see docs/server.md for the routes"}
    wrong_method = httpx.get(f"{server.url}/api/predict/pttest")
    assert wrong_method.status_code == 405 and wrong_method.json() == {"error": "Method Not Allowed"}
    assert wrong_method.headers["allow"] == "POST"
    too_deep = httpx.post(f"{server.url}/api/predict/a/b/c", content=b"")
    assert too_deep.status_code == 404
    assert too_deep.json() == {"error": "no route POST /api/predict/a/b/c; see docs/server.md for the routes"}
    slash = httpx.post(f"{server.url}/api/predict/pttest/", content=b"")
    assert slash.status_code == 200 and "inputs" in slash.json()  # the signature, as without the slash
    kserve_get = httpx.get(f"{server.url}/v2/models/default/versions/1/infer")
    assert kserve_get.status_code == 405 and kserve_get.headers["allow"] == "POST"
    kserve_deep = httpx.post(f"{server.url}/v2/models/default/1/infer", content=b"{}")
    assert kserve_deep.status_code == 404 and kserve_deep.json()["error"].startswith("no route POST")


def test_metrics_count_requests_errors_and_stages(server, demo):
    body = encode_request(_inputs(demo, 8, seed=9))
    for _ in range(3):
        assert httpx.post(f"{server.url}/api/predict/default", content=body).status_code == 200
    httpx.post(f"{server.url}/api/predict/default", content=b"\xff")
    text = httpx.get(f"{server.url}/metrics").text
    lines = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
             for line in text.splitlines() if line and not line.startswith("#")}
    assert lines['recserve_requests_total{code="200",model="default",route="eas"}'] >= 3
    assert lines['recserve_request_errors_total{code="400",model="default",route="eas"}'] >= 1
    for stage in ("decode", "lookup", "run", "encode"):
        assert lines[f'recserve_stage_seconds_count{{model="default",stage="{stage}"}}'] >= 3
    assert lines['recserve_batch_size_bucket{le="8.0",model="default"}'] >= 3
    # the CPU spent serving them: some, and less than the whole server process has used
    process_cpu = tree_cpu_seconds(server.process.pid)
    assert 0 < lines['recserve_request_cpu_seconds_total{model="default",route="eas"}'] < process_cpu
    assert lines['recserve_model_ready{model="default"}'] == 1.0
    assert lines['recserve_serving_version{model="default",version="1"}'] == 1.0
    assert lines['recserve_serving_global_step{model="default"}'] == 1.0
    assert lines['recserve_model_loads_total{model="default",result="ok"}'] == 1.0
    # the native route answered the repeats of one layout; the bad bytes went to Python
    assert lines['recserve_native_route_requests_total{model="default"}'] >= 2
    assert lines['recserve_native_route_fallbacks_total{model="default",reason="parse"}'] >= 1


def test_request_size_limit(launch, demo):
    config = json.loads(demo.config_path.read_text())
    running = launch(config, env={"RECSERVE_MAX_REQUEST_BYTES": "1000"})
    big = encode_request(_inputs(demo, 64))
    assert len(big) > 1000
    response = httpx.post(f"{running.url}/api/predict/x", content=big)
    assert response.status_code == 413
    assert response.json() == {"error": f"request body of {len(big)} bytes exceeds max_request_bytes (1000)"}

    def chunks():
        yield big[:500]
        yield big[500:]

    streamed = httpx.post(f"{running.url}/v2/models/default/infer", content=chunks())
    assert streamed.status_code == 413
    assert streamed.json() == {"error": "request body exceeds max_request_bytes (1000)"}
    small = encode_request(_inputs(demo, 1))
    assert len(small) < 1000
    assert httpx.post(f"{running.url}/api/predict/x", content=small).status_code == 200


@pytest.mark.parametrize("route", ["eas", "tfserving", "kserve"])
def test_not_found_model_is_json_404(server, route):
    url = {"eas": "/api/predict/a/b", "tfserving": "/v1/models/b:predict", "kserve": "/v2/models/b/infer"}[route]
    response = httpx.post(server.url + url, content=b"{}")
    assert response.status_code == 404
    assert response.json() == {"error": "unknown model 'b'; this server serves ['default']"}
