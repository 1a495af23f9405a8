"""Several models in one server (EAS {"models": [...]}), readiness while a model waits
for its first version, and the admin routes that pin a version (bearer token)."""

from __future__ import annotations

import time

import httpx
import numpy as np

from recserve.export.checkpoint_writer import write_checkpoint
from recserve.export.demo import demo_dense, demo_tables, write_demo
from recserve.model_store.checkpoint import TableData
from recserve.wire.codec import decode_response, encode_request

TOKEN = "s3cret-admin-token"


def _second_version(checkpoint_dir) -> None:
    """Version 2: every embedding row doubled, so its predictions differ from version 1's."""
    tables = {name: TableData(keys=t.keys, values=t.values * 2) for name, t in demo_tables().items()}
    write_checkpoint(checkpoint_dir, tables, global_step=2, dense=demo_dense())


def test_models_readiness_and_admin_pin(launch, tmp_path, demo, demo_processor):
    ranker = write_demo(tmp_path / "ranker")
    _second_version(ranker.checkpoint_dir)
    recall = write_demo(tmp_path / "recall")
    empty = tmp_path / "recall-checkpoints"
    empty.mkdir()
    recall_config = recall.config() | {"checkpoint_dir": str(empty), "model_update_interval_seconds": 0.2}
    running = launch(
        {"models": [{"name": "ranker", "model_config": ranker.config()},
                    {"name": "recall", "model_config": recall_config}]},
        env={"RECSERVE_ADMIN_TOKEN": TOKEN}, wait_ready=False,
    )
    url = running.url
    inputs = demo.sample_inputs(6, np.random.default_rng(21))
    body = encode_request(inputs)
    version_1 = demo_processor.predict(inputs)

    # ranker loads on its own (a loaded machine may take a while); recall waits for its first
    # version: the server is live, not ready.
    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/v2/models/ranker/ready").status_code != 200:
        assert time.monotonic() < deadline, "ranker was not ready within 120 s"
        time.sleep(0.1)
    ready = httpx.get(f"{url}/v2/health/ready")
    assert ready.status_code == 503 and ready.json() == {"error": "models recall are not ready"}
    waiting = httpx.post(f"{url}/api/predict/svc/recall", content=body)
    assert waiting.status_code == 503
    assert waiting.json() == {"error": "model 'recall' is still loading"}
    assert httpx.get(f"{url}/v2/models/recall/ready").status_code == 503

    # With several models, the EAS service route needs the model.
    ambiguous = httpx.post(f"{url}/api/predict/svc", content=body)
    assert ambiguous.status_code == 404
    assert ambiguous.json() == {"error": (
        "service 'svc' names no model; this server serves ['ranker', 'recall']: call /api/predict/{service}/{model}")}

    # ranker serves its newest version, 2.
    served = decode_response(httpx.post(f"{url}/api/predict/svc/ranker", content=body).content)
    assert not np.array_equal(served["probabilities"], version_1["probabilities"])

    # Admin: token required.
    pin_url = f"{url}/admin/models/ranker/pin"
    refused = httpx.post(pin_url, json={"version": "1"})
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert refused.json()["error"].startswith("admin routes need 'Authorization: Bearer <token>'")
    assert httpx.post(pin_url, json={"version": "1"}, headers={"Authorization": "Bearer nope"}).status_code == 401
    auth = {"Authorization": f"Bearer {TOKEN}"}
    pinned = httpx.post(pin_url, json={"version": "1"}, headers=auth, timeout=30)
    assert pinned.status_code == 200, pinned.text
    assert (pinned.json()["version"], pinned.json()["pinned_version"]) == ("1", "1")
    served = decode_response(httpx.post(f"{url}/api/predict/svc/ranker", content=body).content)
    for name in ("probabilities", "logits"):
        np.testing.assert_array_equal(served[name], version_1[name])
    missing = httpx.post(pin_url, json={"version": "9"}, headers=auth, timeout=30)
    assert missing.status_code >= 400 and "9" in missing.json()["error"]
    assert httpx.get(f"{url}/models").json()["models"][0]["version"] == "1"
    unpinned = httpx.post(f"{url}/admin/models/ranker/unpin", headers=auth, timeout=30)
    assert unpinned.status_code == 200 and unpinned.json()["version"] == "2"
    assert unpinned.json()["pinned_version"] is None

    # recall becomes ready once a version appears.
    write_checkpoint(empty, demo_tables(), global_step=1, dense=demo_dense())
    deadline = time.monotonic() + 60
    while httpx.get(f"{url}/v2/health/ready").status_code != 200:
        assert time.monotonic() < deadline, f"recall never became ready:\n{running.log()}"
        time.sleep(0.05)
    served = decode_response(httpx.post(f"{url}/api/predict/svc/recall", content=body).content)
    np.testing.assert_array_equal(served["probabilities"], version_1["probabilities"])
    listing = {m["name"]: (m["state"], m["version"]) for m in httpx.get(f"{url}/models").json()["models"]}
    assert listing == {"ranker": ("READY", "2"), "recall": ("READY", "1")}


def test_admin_records_a_warmup_file_from_live_traffic(launch, tmp_path, demo):
    """record -> live EAS HTTP and gRPC requests -> save: the file holds requests that were
    answered 200 (not the refused one, not the signature probe), and a Processor warms up
    with it."""
    import grpc

    from recserve import Processor
    from recserve.proto import eas_service_pb2_grpc, predict_pb2
    from recserve.warmup import read_warmup_file

    running = launch(demo.config(), env={"RECSERVE_ADMIN_TOKEN": TOKEN})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    admin = f"{running.url}/admin/models/default/warmup"
    target = tmp_path / "recorded.bin"
    assert httpx.post(f"{admin}/record", json={"requests": 64}).status_code == 401
    not_started = httpx.post(f"{admin}/save", json={"path": str(target)}, headers=auth)
    assert not_started.status_code == 409
    assert not_started.json() == {"error": "model 'default' is not recording; POST /admin/models/default/warmup/record first"}
    bad = httpx.post(f"{admin}/record", json={"requests": 0}, headers=auth)
    assert bad.status_code == 400 and bad.json() == {"error": '"requests" must be an integer 1..10000, got 0'}
    started = httpx.post(f"{admin}/record", json={"requests": 64}, headers=auth)
    assert started.json() == {"model": "default", "recording": True, "requests": 64}

    bodies = [encode_request(demo.sample_inputs(b, np.random.default_rng(b))) for b in (1, 2, 3)]
    for body in bodies[:2]:
        assert httpx.post(f"{running.url}/api/predict/svc", content=body).status_code == 200
    assert httpx.post(f"{running.url}/api/predict/svc", content=b"").status_code == 200  # signature probe
    assert httpx.post(f"{running.url}/api/predict/svc", content=b"\xff").status_code == 400
    message = predict_pb2.PredictRequest.FromString(bodies[2])
    with grpc.insecure_channel(running.grpc_address) as channel:
        eas_service_pb2_grpc.PredictionServiceStub(channel).Predict(message, timeout=30)
    bodies[2] = message.SerializeToString()  # the bytes the gRPC client sent

    relative = httpx.post(f"{admin}/save", json={"path": "recorded.bin"}, headers=auth)
    assert relative.status_code == 400
    saved = httpx.post(f"{admin}/save", json={"path": str(target)}, headers=auth)
    assert saved.status_code == 200, saved.text
    assert saved.json() == {"path": str(target), "requests": 3, "seen": 3}
    assert sorted(read_warmup_file(target)) == sorted(bodies)
    again = httpx.post(f"{admin}/save", json={"path": str(target)}, headers=auth)
    assert again.status_code == 409  # saving ends the recording

    processor = Processor(demo.config() | {"warmup_file_name": str(target)})
    try:
        assert processor.ready
    finally:
        processor.close()
