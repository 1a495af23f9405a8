"""`recserve serve` with DeepRec's config pointing at a TensorFlow SavedModel and a trainer's
checkpoint parent: EAS protobuf over HTTP and gRPC and TF Serving REST, each within 1e-5 of
TensorFlow's own session.run, and a newer checkpoint version served as it appears."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import time
from pathlib import Path

import grpc
import httpx
import numpy as np
from model_requests import keras_requests, requests
from tf_helpers import run_tf, tf_predict

from recserve.convert import converted_model_dir
from recserve.proto import eas_service_pb2_grpc, predict_pb2
from recserve.wire.codec import decode_response, encode_request

_spec = importlib.util.spec_from_file_location("server_fixtures", Path(__file__).parents[1] / "server" / "conftest.py")
server_fixtures = importlib.util.module_from_spec(_spec)  # type: ignore[arg-type]
sys.modules["server_fixtures"] = server_fixtures  # its dataclasses look their module up
_spec.loader.exec_module(server_fixtures)  # type: ignore[union-attr]
launch = server_fixtures.launch
TOLERANCE = 1e-5


def _rest_inputs(batch: dict[str, np.ndarray]) -> dict[str, list]:
    return {k: v.astype(str).tolist() if v.dtype == object else v.tolist() for k, v in batch.items()}


def _copy_version(source: Path, target: Path) -> None:
    target.mkdir(parents=True)
    for path in sorted(source.iterdir()):
        if path.is_file() and path.name != "checkpoint":
            shutil.copy(path, target / path.name)
    shutil.copy(source / "checkpoint", target / "checkpoint")  # last, as a trainer's Saver does


def test_recserve_serve_answers_eas_grpc_and_tfserving_like_tensorflow(tf_model, tmp_path, launch):
    savedmodel = tf_model / "savedmodel"
    converted_model_dir(str(savedmodel))  # convert (or reuse) before the server's 60 s readiness wait
    parent = tmp_path / "checkpoints"
    _copy_version(tf_model / "ckpt" / "1", parent / "1")
    server = launch({"model_store_type": "local", "savedmodel_dir": str(savedmodel), "checkpoint_dir": str(parent),
                     "signature_name": "serving_default", "model_update_interval_seconds": 0.5})
    batches = requests(6, 4, 51)
    first = tf_predict(savedmodel, batches, tmp_path, str(tf_model / "ckpt" / "1" / "model.ckpt-3"))
    second = tf_predict(savedmodel, batches, tmp_path, str(tf_model / "ckpt" / "2" / "model.ckpt-6"))

    def answers() -> list[list[np.ndarray]]:
        out = []
        with grpc.insecure_channel(server.grpc_address) as channel:
            stub = eas_service_pb2_grpc.PredictionServiceStub(channel)
            for batch in batches:
                eas = httpx.post(f"{server.url}/api/predict/default", content=encode_request(batch), timeout=30)
                assert eas.status_code == 200, eas.text
                rest = httpx.post(f"{server.url}/v1/models/default:predict",
                                  json={"inputs": _rest_inputs(batch)}, timeout=30)
                assert rest.status_code == 200, rest.text
                over_grpc = stub.Predict(predict_pb2.PredictRequest.FromString(encode_request(batch)), timeout=30)
                out.append([decode_response(eas.content)["prob"],
                            np.array(rest.json()["outputs"], np.float32),  # TF Serving: one output, unnamed
                            decode_response(over_grpc.SerializeToString())["prob"]])
        return out

    def worst(got: list[list[np.ndarray]], want: list[np.ndarray]) -> float:
        return max(float(np.abs(a - w).max()) for answers, w in zip(got, want) for a in answers)

    assert worst(answers(), first) <= TOLERANCE
    _copy_version(tf_model / "ckpt" / "2", parent / "2")
    deadline = time.monotonic() + 30
    while worst(answers(), second) > TOLERANCE:
        assert time.monotonic() < deadline, "version 2 not served within 30 s"
        time.sleep(0.5)


def test_recserve_serve_answers_a_keras_savedmodel_like_tensorflow(tmp_path, launch):
    """A Keras 3 `model.export` SavedModel in savedmodel_dir (no checkpoint_dir): TF Serving
    REST in the row (`instances`) and column (`inputs`) forms and EAS protobuf, each within
    1e-5 of TensorFlow running the same SavedModel."""
    savedmodel = tmp_path / "keras"
    run_tf("write", str(savedmodel), "export", script="keras_model.py")
    converted_model_dir(str(savedmodel))  # convert before the server's 60 s readiness wait
    server = launch({"model_store_type": "local", "savedmodel_dir": str(savedmodel)})
    batches = keras_requests(6, 3, 52)
    want = tf_predict(savedmodel, batches, tmp_path, tf2=True)
    for batch, expected in zip(batches, want):
        eas = httpx.post(f"{server.url}/api/predict/default", content=encode_request(batch), timeout=30)
        assert eas.status_code == 200, eas.text
        columns = _rest_inputs(batch)
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(batch["item"]))]
        by_rows = httpx.post(f"{server.url}/v1/models/default:predict", json={"instances": rows}, timeout=30)
        assert by_rows.status_code == 200, by_rows.text
        by_columns = httpx.post(f"{server.url}/v1/models/default:predict", json={"inputs": columns}, timeout=30)
        assert by_columns.status_code == 200, by_columns.text
        for got in (decode_response(eas.content)["output_0"], np.array(by_rows.json()["predictions"], np.float32),
                    np.array(by_columns.json()["outputs"], np.float32)):
            assert got.shape == expected.shape
            assert float(np.abs(got - expected).max()) <= TOLERANCE
