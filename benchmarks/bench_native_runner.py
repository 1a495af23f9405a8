"""The dense run through ONNX Runtime's C API (recserve.runtime.native_runner) vs the
Python binding's `InferenceSession.run` on the same model file, and how the C API runner
scales from one Python thread to two (issue 24, item 2)."""

from __future__ import annotations

import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from benchmarks.models import build_plain_dlrm
from benchmarks.report import Row
from recserve.runtime import native_runner
from recserve.runtime.native_runner import NativeRunner
from recserve.runtime.session_options import ThreadSettings, session_option_values

SECONDS = 3.0
NOTES = """Model: the plain DLRM-like ONNX file of bench_processor (26 Gathers on [40000, 16]
initializers, 13 dense features, MLP 429-512-256-1, 27 inputs). Both sides load that file
with 1 intra-op thread, spinning off and ONNX Runtime's default prepacking; the C API
runner is the wheel's own libonnxruntime.so (dlopen'ed, OrtApi version 11) called through
ctypes from Python, so its rows include the ctypes marshalling of 27 feeds per call; native
callers (the request route) skip that. Latency/throughput rows alternate the two sides call
by call (order swapped every call); outputs are checked equal first.

Thread rows: each thread calls back to back for 3 s with its own pre-built requests; the C
API runner has 2 sessions (RR), the Python binding 2 sessions (one per thread). The
machine (2 cores) was shared with other agents' builds and tests while these ran: read the
ratios, which are measured in the same run, not the absolute numbers."""


def _python_session(path: str) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _native(path: str, sessions: int) -> NativeRunner:
    native_runner.use_env()
    runner = NativeRunner(policy="RR", initializers={})
    values = session_option_values(ThreadSettings(intra=1), prepacking=True)
    for _ in range(sessions):
        runner.add_session(path, values, [("CPUExecutionProvider", {})])
    return runner


def _calls_per_second(calls: list[Callable[[], Any]]) -> float:
    """Every callable in its own thread, back to back for SECONDS; total calls per second."""
    counts = [0] * len(calls)
    stop = threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set():
            calls[i]()
            counts[i] += 1

    threads = [threading.Thread(target=loop, args=(i,)) for i in range(len(calls))]
    started = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(SECONDS)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return sum(counts) / (time.perf_counter() - started)


def _thread_row(path: str, reqs: list[dict[str, np.ndarray]], batch: int) -> Row:
    two = _native(path, 2)
    one_native = _calls_per_second([lambda: two.run(reqs[0], ["prob"])])
    two_native = _calls_per_second([lambda r=r: two.run(r, ["prob"]) for r in reqs])
    two.close()
    pair = [_python_session(path), _python_session(path)]
    one_python = _calls_per_second([lambda: pair[0].run(["prob"], reqs[0])])
    two_python = _calls_per_second([lambda s=s, r=r: s.run(["prob"], r) for s, r in zip(pair, reqs)])
    return Row(
        f"C API runner: 2 Python threads vs 1, batch {batch}",
        f"{two_native:,.0f} runs/s (1 thread {one_native:,.0f})",
        f"InferenceSession.run: 2 threads {two_python:,.0f} runs/s (1 thread {one_python:,.0f}), "
        f"ratio {two_python / one_python:.2f}",
        two_native / one_native,
    )


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-native-"))
    rows: list[Row] = []
    try:
        model = build_plain_dlrm(root)
        path = str(model.onnx_path)
        session = _python_session(path)
        runner = _native(path, 1)
        rng = np.random.default_rng(3)
        for batch, rounds in ((1, 4000), (64, 600), (512, 100)):
            reqs = [model.sample(batch, rng) for _ in range(8)]
            for r in reqs:
                assert np.array_equal(runner.run(r, ["prob"])[0], session.run(["prob"], r)[0])
            t_ort: list[float] = []
            t_native: list[float] = []
            for k in range(rounds):
                r = reqs[k % len(reqs)]
                first, second = (session, runner) if k % 2 else (runner, session)
                for side in (first, second):
                    t0 = time.perf_counter()
                    if side is session:
                        session.run(["prob"], r)
                        t_ort.append(time.perf_counter() - t0)
                    else:
                        runner.run(r, ["prob"])
                        t_native.append(time.perf_counter() - t0)
            p50_ort, p50_native = statistics.median(t_ort) * 1e6, statistics.median(t_native) * 1e6
            rows.append(Row(
                f"C API runner via ctypes vs InferenceSession.run, batch {batch}, 1 thread (p50)",
                f"{p50_native:.0f} us", f"InferenceSession.run {p50_ort:.0f} us", p50_ort / p50_native,
            ))
        runner.close()
        rows += [_thread_row(path, [model.sample(batch, rng) for _ in range(2)], batch) for batch in (1, 64)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows
