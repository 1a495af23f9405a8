"""Server fields given in the config file (no RECSERVE_* environment override):
max_request_bytes bounds HTTP bodies and gRPC messages, admin_token guards the admin routes."""

from __future__ import annotations

import grpc
import httpx
import numpy as np
import pytest

from recserve.export.checkpoint_writer import write_checkpoint
from recserve.export.demo import demo_dense, demo_tables, write_demo
from recserve.proto import eas_service_pb2_grpc, predict_pb2
from recserve.wire.codec import decode_response, encode_request

LIMIT = 1000
TOKEN = "file-admin-token-5e2"


@pytest.fixture
def running(launch, tmp_path, monkeypatch):
    for name in ("RECSERVE_MAX_REQUEST_BYTES", "RECSERVE_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)  # the config file's values, not the environment's
    demo = write_demo(tmp_path / "demo")
    write_checkpoint(demo.checkpoint_dir, demo_tables(), global_step=2, dense=demo_dense())  # 1 is pinnable
    return launch(demo.config() | {"max_request_bytes": LIMIT, "admin_token": TOKEN})


def test_max_request_bytes_from_the_file_bounds_http_and_grpc(running, demo, demo_processor):
    rng = np.random.default_rng(3)
    big, small = demo.sample_inputs(64, rng), demo.sample_inputs(1, rng)
    big_body, small_body = encode_request(big), encode_request(small)
    assert len(big_body) > LIMIT > len(small_body)
    refused = httpx.post(f"{running.url}/api/predict/default", content=big_body, timeout=30)
    assert refused.status_code == 413
    assert refused.json() == {"error": f"request body of {len(big_body)} bytes exceeds max_request_bytes ({LIMIT})"}
    served = httpx.post(f"{running.url}/api/predict/default", content=small_body, timeout=30)
    assert served.status_code == 200, served.text
    want = demo_processor.predict(small)["probabilities"]
    np.testing.assert_array_equal(decode_response(served.content)["probabilities"], want)

    with grpc.insecure_channel(running.grpc_address) as channel:
        stub = eas_service_pb2_grpc.PredictionServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.Predict(predict_pb2.PredictRequest.FromString(big_body), timeout=30)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"vs. {LIMIT})" in caught.value.details(), caught.value.details()
        reply = stub.Predict(predict_pb2.PredictRequest.FromString(small_body), timeout=30)
        np.testing.assert_array_equal(decode_response(reply.SerializeToString())["probabilities"], want)


def test_admin_token_from_the_file_guards_the_admin_routes(running):
    pin_url = f"{running.url}/admin/models/default/pin"
    refused = httpx.post(pin_url, json={"version": "1"}, timeout=30)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"].startswith("admin routes need 'Authorization: Bearer <token>'")
    wrong = httpx.post(pin_url, json={"version": "1"}, headers={"Authorization": "Bearer nope"}, timeout=30)
    assert wrong.status_code == 401
    assert httpx.get(f"{running.url}/models").json()["models"][0]["version"] == "2"  # nothing pinned
    pinned = httpx.post(pin_url, json={"version": "1"}, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30)
    assert pinned.status_code == 200, pinned.text
    assert (pinned.json()["version"], pinned.json()["pinned_version"]) == ("1", "1")
    assert TOKEN not in running.log()
