"""KServe v2 JSON: recserve against KServe's own Python model server hosting the same plain
ONNX file with onnxruntime (benchmarks/peers/kserve_onnx.py), side by side (issue "every
model on the fast path", goal 4)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

from benchmarks.load_tools import free_port, post_script, wait_ready, wrk
from benchmarks.models import build_plain_dlrm
from benchmarks.report import Row

ROOT = Path(__file__).resolve().parent.parent
PEER_PYTHON = ROOT / ".venv-peers" / "bin" / "python"
SECONDS, ROUNDS = 5, 3
GOALS = {1: 3.0, 64: 2.0}
NOTES = f"""Plain exporter-style ONNX model (26 Gathers on [40000, 16] initializers, 13 dense
features, MLP 429-512-256-1), one process each, 1 intra-op and 1 inter-op thread each:
recserve serving it with enable_device_placement_optimization, and KServe's Python model
server (kserve from PyPI, in .venv-peers, `make peers`) with an onnxruntime InferenceSession
in a `kserve.Model` (benchmarks/peers/kserve_onnx.py; no access log, no latency logging).
The same KServe v2 JSON body (`{{"inputs": [...]}}`, FP32 and INT64 data lists) posted by
`wrk -t1 -c16` for {SECONDS} s per run after a 2 s warmup, {ROUNDS} alternating rounds, the
median kept. Outputs of both checked equal (within 1e-5) before timing. A third server,
recserve with RECSERVE_NATIVE_ROUTE=0 (predict on the Python route, as before
recserve.processor.native_predict), runs in the same rounds: its rate is in each row's
name. The machine is shared with other agents: compare ratios."""


def _body(inputs: dict[str, np.ndarray]) -> bytes:
    tensors = [{"name": name, "shape": list(value.shape),
                "datatype": "FP32" if value.dtype == np.float32 else "INT64", "data": value.ravel().tolist()}
               for name, value in inputs.items()]
    return json.dumps({"inputs": tensors}).encode()


def run() -> list[Row]:
    if not PEER_PYTHON.exists():
        raise RuntimeError(f"{PEER_PYTHON} is missing: `make peers` installs kserve and onnxruntime there")
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: make bench installs it (apt-get install wrk)")
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-kserve-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        model = build_plain_dlrm(root)
        config = root / "config.json"
        # KServe's server sheds nothing; recserve's admission (max_queue_ms, 100 ms by default)
        # would answer 503 to requests a loaded machine kept waiting. Throughput against
        # throughput: every request of both is served.
        config.write_text(json.dumps(model.config(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1,
                                                  max_queue_ms=60_000)))
        ours_port, peer_port, python_port = free_port(), free_port(), free_port()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "recserve.server.cli", "--log-level", "WARNING", "serve", "--config", str(config),
             "--http-port", str(ours_port), "--grpc-port", str(free_port())], cwd=ROOT))
        procs.append(subprocess.Popen(
            [str(PEER_PYTHON), str(ROOT / "benchmarks" / "peers" / "kserve_onnx.py"), str(model.onnx_path), "plain",
             str(peer_port), str(free_port()), "--configure_logging", "false"], cwd=ROOT,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        # recserve with its native route off: Processor.predict on the Python route, as the
        # KServe handlers served before recserve.processor.native_predict.
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "recserve.server.cli", "--log-level", "WARNING", "serve", "--config", str(config),
             "--http-port", str(python_port), "--grpc-port", str(free_port())], cwd=ROOT,
            env={**os.environ, "RECSERVE_NATIVE_ROUTE": "0"}))
        ours = f"http://127.0.0.1:{ours_port}/v2/models/default/infer"
        peer = f"http://127.0.0.1:{peer_port}/v2/models/plain/infer"
        python = f"http://127.0.0.1:{python_port}/v2/models/default/infer"
        wait_ready(f"http://127.0.0.1:{ours_port}/v2/health/ready", procs[0], what="recserve serve", timeout=120)
        wait_ready(f"http://127.0.0.1:{peer_port}/v2/models/plain/ready", procs[1], what="the KServe peer", timeout=120)
        wait_ready(f"http://127.0.0.1:{python_port}/v2/health/ready", procs[2], what="recserve serve (Python route)",
                   timeout=120)
        rows = []
        for batch in (1, 64):
            body = _body(model.sample(batch, np.random.default_rng(batch)))
            answers = [httpx.post(url, content=body, headers={"Content-Type": "application/json"}).json()
                       for url in (ours, peer, python)]
            mine, theirs, before = (np.asarray(a["outputs"][0]["data"], np.float32) for a in answers)
            np.testing.assert_allclose(mine, theirs, atol=1e-5)
            np.testing.assert_array_equal(mine, before)
            script = post_script(root, body, f"b{batch}", content_type="application/json")
            rates: dict[str, list[float]] = {ours: [], peer: [], python: []}
            for url in rates:
                wrk(url, script, threads=1, connections=16, seconds=2)
            for _ in range(ROUNDS):
                for url, measured in rates.items():
                    result = wrk(url, script, threads=1, connections=16, seconds=SECONDS)
                    assert result["non2xx"] == 0, result
                    measured.append(result["requests"] / result["seconds"])
            mine_rate, peer_rate = float(np.median(rates[ours])), float(np.median(rates[peer]))
            python_rate = float(np.median(rates[python]))
            ratio = mine_rate / peer_rate
            rows.append(Row(f"KServe v2 JSON, plain ONNX model, batch {batch}, wrk -c16: recserve / KServe's Python "
                            f"server (onnxruntime), requests/s (recserve with the native route off "
                            f"{python_rate:,.0f} req/s; load average {os.getloadavg()[0]:.1f})",
                            f"{mine_rate:,.0f} req/s", f"{peer_rate:,.0f} req/s",
                            ratio, f">= {GOALS[batch]:g}", ratio >= GOALS[batch]))
        return rows
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)
