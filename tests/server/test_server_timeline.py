"""Timelines: the timeline_* fields choose requests by step; each chosen request leaves
a Chrome-trace JSON with recserve's spans, merged with an ONNX Runtime profile when the
request has one; oss:// paths go through the S3 API (a real moto server)."""

from __future__ import annotations

import json

import boto3
import httpx
import numpy as np
import onnxruntime as ort
import pytest

from recserve.config import parse_config
from recserve.processor.trace import RequestTrace
from recserve.server.timeline import TimelineSelector, chrome_trace, write_timeline
from recserve.wire.codec import encode_request


def test_selector_steps():
    selector = TimelineSelector(start=2, interval=3, count=3)
    assert [step for step in (selector.take() for _ in range(20)) if step is not None] == [2, 5, 8]


def test_server_writes_timelines_for_chosen_steps(launch, demo, tmp_path):
    out = tmp_path / "timelines"
    config = json.loads(demo.config_path.read_text()) | {
        "timeline_start_step": 1, "timeline_interval_step": 2, "timeline_trace_count": 2,
        "timeline_path": str(out)}
    running = launch(config)
    body = encode_request(demo.sample_inputs(4, np.random.default_rng(3)))
    for _ in range(6):
        assert httpx.post(f"{running.url}/api/predict/svc", content=body).status_code == 200
    metrics = httpx.get(f"{running.url}/metrics").text
    assert 'recserve_timelines_written_total{model="default",result="ok"} 2.0' in metrics
    assert sorted(p.name for p in out.iterdir()) == ["timeline-default-step1.json", "timeline-default-step3.json"]
    doc = json.loads((out / "timeline-default-step3.json").read_text())
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") == "recserve"]
    assert [e["name"] for e in spans] == ["decode", "lookup", "run", "encode"]
    assert all(e["dur"] >= 0 and e["args"] == {"batch_size": 4} for e in spans)
    # The chosen request's run was profiled by ONNX Runtime: its kernels sit inside "run".
    ort_events = [e for e in doc["traceEvents"] if e["ph"] == "X" and e.get("cat") != "recserve"]
    names = {e["name"] for e in ort_events}
    assert "model_run" in names and "model_loading_uri" not in names
    assert any(e.get("cat") == "Node" for e in ort_events)
    run = spans[2]
    model_run = next(e for e in ort_events if e["name"] == "model_run")
    assert run["ts"] <= model_run["ts"] <= run["ts"] + run["dur"]
    assert doc["otherData"] == {"model": "default", "step": 3, "model_version": "1", "batch_size": 4}


def _ort_profile(demo, tmp_path) -> str:
    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = str(tmp_path / "ort")
    session = ort.InferenceSession(str(demo.model_dir / "model.onnx"), options, providers=["CPUExecutionProvider"])
    feeds = {}
    for arg in session.get_inputs():
        shape = [2 if not isinstance(d, int) else d for d in arg.shape]
        feeds[arg.name] = np.zeros(shape, np.float32)
    session.run(None, feeds)
    return session.end_profiling()


def test_chrome_trace_merges_the_ort_profile(demo, tmp_path):
    profile = _ort_profile(demo, tmp_path)
    trace = RequestTrace()
    with trace.span("lookup"):
        pass
    with trace.span("run"):
        pass
    trace.ort_profile_path = profile
    doc = chrome_trace("m", 0, trace)
    run = next(e for e in doc["traceEvents"] if e.get("name") == "run")
    ort_events = [e for e in doc["traceEvents"] if e.get("pid") == 2 and e["ph"] == "X"]
    model_run = next(e for e in ort_events if e["name"] == "model_run")
    assert model_run["ts"] == pytest.approx(run["ts"])
    with open(profile) as f:
        raw = json.load(f)
    # Every event from the run on is merged; the session's own loading, before it, is not.
    start = next(e["ts"] for e in raw if e.get("name") == "model_run")
    assert len(ort_events) == len([e for e in raw if e["ph"] == "X" and e["ts"] >= start])
    assert {e["name"] for e in raw if e["ts"] < start} >= {"model_loading_uri"}
    assert any(e.get("cat") == "Node" for e in ort_events)


def test_timeline_to_oss(demo, tmp_path):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="id", aws_secret_access_key="key",
                          region_name="us-east-1")
        s3.create_bucket(Bucket="traces")
        config = parse_config(json.loads(demo.config_path.read_text()) | {
            "timeline_start_step": 0, "timeline_interval_step": 1, "timeline_trace_count": 1,
            "timeline_path": "oss://traces/run1", "oss_endpoint": endpoint,
            "oss_access_id": "id", "oss_access_key": "key"})
        trace = RequestTrace()
        with trace.span("run"):
            pass
        assert write_timeline(config, "default", 0, trace) == "oss://traces/run1/timeline-default-step0.json"
        stored = s3.get_object(Bucket="traces", Key="run1/timeline-default-step0.json")["Body"].read()
        assert json.loads(stored)["traceEvents"][2]["name"] == "run"
    finally:
        server.stop()
