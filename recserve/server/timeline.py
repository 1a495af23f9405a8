"""Timelines: Chrome-trace JSON for chosen requests (DeepRec's timeline_* fields).

`TimelineSelector` picks requests by step (the model's request count, from 0):
``timeline_start_step``, then every ``timeline_interval_step``, ``timeline_trace_count``
times. `chrome_trace` turns a request's `RequestTrace` spans, plus the ONNX Runtime
profile of its run when the trace has one (`RequestTrace.ort_profile_path`), into one
Chrome-trace document (open it in Perfetto or chrome://tracing); `write_timeline` puts it
under ``timeline_path``: a local directory or an ``oss://bucket/prefix`` URL.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from recserve.config import ProcessorConfig, Secret
from recserve.errors import StorageError
from recserve.processor.trace import RequestTrace

__all__ = ["TimelineSelector", "chrome_trace", "write_timeline"]

log = logging.getLogger("recserve.server")

_RECSERVE_PID, _ORT_PID = 1, 2


class TimelineSelector:
    """Which requests of one model get a timeline. Thread-safe."""

    def __init__(self, start: int, interval: int, count: int) -> None:
        self.start, self.interval, self.count = start, interval, count
        self._steps = itertools.count()
        self._lock = threading.Lock()

    @classmethod
    def from_config(cls, config: ProcessorConfig) -> TimelineSelector | None:
        if config.timeline_path is None or config.timeline_trace_count is None:
            return None
        return cls(config.timeline_start_step or 0, config.timeline_interval_step or 1,
                   config.timeline_trace_count)

    def take(self) -> int | None:
        """Count one request; its step when it is to be traced, else None."""
        with self._lock:
            step = next(self._steps)
        offset = step - self.start
        if offset < 0 or offset % self.interval or offset // self.interval >= self.count:
            return None
        return step


def _ort_events(path: str, run_start_us: float) -> list[dict[str, Any]]:
    """The profile's events, moved onto recserve's clock: ORT's `model_run` event is
    aligned with the start of recserve's `run` span (ORT's clock starts at profiling)."""
    with open(path, encoding="utf-8") as f:
        events = json.load(f)
    runs = [e["ts"] for e in events if e.get("name") == "model_run" and "ts" in e]
    origin = min(runs) if runs else min((e["ts"] for e in events if "ts" in e), default=0)
    out = []
    for e in events:
        # The profiled session is created for this request: its loading is not the request's.
        if "ts" not in e or e["ts"] < origin:
            continue
        moved = dict(e)
        moved["ts"] = e["ts"] - origin + run_start_us
        moved["pid"] = _ORT_PID
        out.append(moved)
    return out


def chrome_trace(model: str, step: int, trace: RequestTrace) -> dict[str, Any]:
    """The Chrome-trace document of one request (timestamps in µs on perf_counter)."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "pid": _RECSERVE_PID, "name": "process_name", "args": {"name": f"recserve {model}"}},
        {"ph": "M", "pid": _ORT_PID, "name": "process_name", "args": {"name": "onnxruntime"}},
    ]
    for span in trace.spans:
        events.append({
            "ph": "X", "pid": _RECSERVE_PID, "tid": 1, "cat": "recserve", "name": span.stage,
            "ts": span.start_ns / 1000.0, "dur": (span.end_ns - span.start_ns) / 1000.0,
            "args": {"batch_size": trace.batch_size},
        })
    if trace.ort_profile_path:
        run = next((s for s in trace.spans if s.stage == "run"), None)
        start = run.start_ns / 1000.0 if run else (trace.spans[0].start_ns / 1000.0 if trace.spans else 0.0)
        events.extend(_ort_events(trace.ort_profile_path, start))
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"model": model, "step": step, "model_version": trace.model_version,
                      "batch_size": trace.batch_size},
    }


def timeline_name(model: str, step: int) -> str:
    worker = os.environ.get("RECSERVE_WORKER_INDEX")  # worker processes each write their own
    return f"timeline-{model}-step{step}.json" if worker is None else f"timeline-{model}-w{worker}-step{step}.json"


def write_timeline(config: ProcessorConfig, model: str, step: int, trace: RequestTrace) -> str:
    """Write the request's timeline under config.timeline_path; returns where it went."""
    assert config.timeline_path is not None
    data = json.dumps(chrome_trace(model, step, trace)).encode()
    name = timeline_name(model, step)
    if config.timeline_path.startswith("oss://"):
        return _put_oss(config, config.timeline_path, name, data)
    directory = Path(config.timeline_path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / name
        tmp = target.with_suffix(".json.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, target)
    except OSError as exc:
        raise StorageError(f"cannot write timeline {name} to {directory}: {exc.strerror}") from exc
    return str(target)


def _put_oss(config: ProcessorConfig, url: str, name: str, data: bytes) -> str:
    """Upload through OSS's S3-compatible API with the config's oss_* fields (set up as
    recserve.model_store.oss.ObjectStorage does; that class only reads)."""
    import boto3
    import botocore.config
    import botocore.exceptions

    from recserve.model_store.oss import oss_region, split_url

    bucket, prefix = split_url(url)
    key = "/".join(p for p in (prefix.strip("/"), name) if p)
    endpoint = config.oss_endpoint
    if endpoint and "://" not in endpoint:
        endpoint = "https://" + endpoint
    region = oss_region(endpoint) if endpoint else None

    def reveal(secret: Secret | None) -> str | None:
        return secret.reveal() if secret is not None else None

    try:
        client = boto3.session.Session().client(
            "s3", endpoint_url=endpoint, region_name=region,
            aws_access_key_id=reveal(config.oss_access_id),
            aws_secret_access_key=reveal(config.oss_access_key),
            config=botocore.config.Config(
                s3={"addressing_style": "virtual" if region else "auto"},
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        client.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json")
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, ValueError) as exc:
        raise StorageError(f"cannot write timeline {name} to oss://{bucket}/{key}: {exc}") from exc
    return f"oss://{bucket}/{key}"
