"""Every answer names the version that computed it: HTTP headers X-Recserve-Model-Version
and X-Recserve-Delta-Step on the EAS, TF Serving and KServe routes, gRPC trailing metadata
on the EAS service; in one process and with worker processes. An answer that claims a delta
was computed with that delta's rows."""

from __future__ import annotations

import time

import grpc
import httpx
import numpy as np
import pytest

from recserve.export import write_delta
from recserve.proto import eas_service_pb2_grpc, predict_pb2
from recserve.wire.codec import decode_response, encode_request
from tests.server.conftest import write_rows_model

ROWS, DIM = 1000, 4
IDS = np.arange(0, ROWS, 97, dtype=np.int64)


def claimed(headers: httpx.Headers) -> tuple[str, str]:
    return headers["x-recserve-model-version"], headers["x-recserve-delta-step"]


@pytest.mark.parametrize("workers", [1, 2])
def test_answers_name_their_version_and_delta(launch, tmp_path, workers):
    config = write_rows_model(tmp_path, ROWS, DIM)
    running = launch(config, workers=workers)
    body = encode_request({"ids": IDS})

    eas = httpx.post(f"{running.url}/api/predict/default", content=body)
    assert eas.status_code == 200 and claimed(eas.headers) == ("1", "0")
    tf = httpx.post(f"{running.url}/v1/models/default:predict", json={"inputs": {"ids": IDS.tolist()}})
    assert tf.status_code == 200 and claimed(tf.headers) == ("1", "0")
    kserve = httpx.post(f"{running.url}/v2/models/default/infer", json={"inputs": [
        {"name": "ids", "shape": [len(IDS)], "datatype": "INT64", "data": IDS.tolist()}]})
    assert kserve.status_code == 200 and claimed(kserve.headers) == ("1", "0")
    bad = httpx.post(f"{running.url}/api/predict/default", content=b"\xff")
    assert bad.status_code == 400 and "x-recserve-model-version" not in bad.headers
    with grpc.insecure_channel(running.grpc_address) as channel:
        stub = eas_service_pb2_grpc.PredictionServiceStub(channel)
        _, call = stub.Predict.with_call(predict_pb2.PredictRequest.FromString(body), timeout=10)
        assert dict(call.trailing_metadata()) == {"x-recserve-model-version": "1", "x-recserve-delta-step": "0"}

    write_delta(tmp_path / "checkpoints" / "1",
                {"t": (np.arange(ROWS, dtype=np.int64), np.full((ROWS, DIM), 2.0, np.float32))}, global_step=2)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        response = httpx.post(f"{running.url}/api/predict/default", content=body)  # fresh connection: any worker
        rows = decode_response(response.content)["row"]
        if claimed(response.headers) == ("1", "2"):
            np.testing.assert_array_equal(rows, 2.0)  # a claimed delta is in the answer
            if all(claimed(httpx.post(f"{running.url}/api/predict/default", content=body).headers)[1] == "2"
                   for _ in range(10)):
                _grpc_names_delta_2(running.grpc_address, body)
                return
        time.sleep(0.05)
    pytest.fail(f"answers never named delta 2:\n{running.log()}")


def _grpc_names_delta_2(address: str, body: bytes) -> None:
    """gRPC Predicts (a channel each: any worker), answered natively by the gRPC front end
    after the first of the layout, name delta 2 and hold its rows."""
    for _ in range(6):
        with grpc.insecure_channel(address) as channel:
            predict = channel.unary_unary("/tensorflow.eas.PredictionService/Predict")
            for _ in range(2):
                answer, call = predict.with_call(body, timeout=30)
                assert dict(call.trailing_metadata()) == {"x-recserve-model-version": "1",
                                                          "x-recserve-delta-step": "2"}
                np.testing.assert_array_equal(decode_response(answer)["row"], 2.0)
