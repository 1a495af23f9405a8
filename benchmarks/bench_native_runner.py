"""The dense run through ONNX Runtime's C API (recserve.runtime.native_runner) vs the
Python binding's `InferenceSession.run` on the same model file, and how the C API runner
scales from one Python thread to two (issue 24, item 2)."""

from __future__ import annotations

import array
import os
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

from benchmarks.models import PlainDlrmModel, build_plain_dlrm
from benchmarks.report import Row
from recserve import Processor
from recserve.runtime import native_runner
from recserve.runtime.native_runner import NativeRunner
from recserve.runtime.session_options import ThreadSettings, session_option_values
from recserve.wire.codec import decode_response, encode_request

WINDOW = 0.5
WINDOWS = 9
NOTES = """Model: the plain DLRM-like ONNX file of bench_processor (26 Gathers on [40000, 16]
initializers, 13 dense features, MLP 429-512-256-1, 27 inputs). Both sides load that file
with 1 intra-op thread, spinning off and ONNX Runtime's default prepacking; the C API
runner is the wheel's own libonnxruntime.so (dlopen'ed, OrtApi version 11) called through
ctypes from Python, so its rows include the ctypes marshalling of 27 feeds per call; native
callers (the request route) skip that: the "C API run alone" rows time just the C call with
the 27 descriptors built beforehand, against the Python binding's own run without its
Python-side input checks (`InferenceSession._sess.run`). The four sides alternate call by
call, rotating which goes first; outputs are checked equal first.

Processor rows: `Processor.process` on the same model served with device placement (the
26 Gathers go to the embedding engine, the Concat is folded: the dense run has 1 input),
its dense run on the C API runner vs on the Python binding's sessions
(RECSERVE_NATIVE_DENSE=0: the path before the C API runner), alternating call by call.
Requests after the first of their layout take the Python route path; the native route
(issue 24 item 1) is not in these numbers.

Thread rows: each thread calls back to back with its own pre-built requests; the C API
runner has 2 sessions (RR), the Python binding 2 sessions (one per thread). 1-thread and
2-thread windows of 0.5 s alternate 9 times; the rows give the medians and the median of
the 9 ratios. The
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
    """Every callable in its own thread, back to back for WINDOW seconds; total calls per second."""
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
    time.sleep(WINDOW)
    stop.set()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    return sum(counts) / (time.perf_counter() - started)


def _seam_call(runner: NativeRunner, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
    """A run as native callers make it: descriptors built once, then only the C call (and
    freeing its outputs); through the module's private ctypes entry points on purpose."""
    words: list[int] = []
    dims: list[int] = []
    for name, value in feeds.items():
        words += (runner._name(name), native_runner._ELEM_TYPES[value.dtype], len(dims), value.ndim,
                  native_runner._address(value))
        dims += value.shape
    packed = array.array("q", words + dims)
    base, count = packed.buffer_info()[0], len(feeds)
    scratch, names, lib = runner._scratch(1), runner._output_names(["prob"]), native_runner._lib

    def call(packed: array.array = packed) -> None:  # the default keeps the buffer alive
        assert lib.rs_ort_run_any(runner.handle, 0, base, count, names, 1, scratch.outs_at, scratch.err_at) == 0
        lib.rs_ort_free_outputs(scratch.outs_at, 1)

    return call


def _scaling(one: Callable[[], Any], two: list[Callable[[], Any]]) -> tuple[float, float, float]:
    """Median 1-thread rate, 2-thread rate and their ratio over WINDOWS alternating pairs of
    windows (load from other processes drifts faster than a long window would average out)."""
    ones, twos, ratios = [], [], []
    for _ in range(WINDOWS):
        ones.append(_calls_per_second([one]))
        twos.append(_calls_per_second(two))
        ratios.append(twos[-1] / ones[-1])
    return statistics.median(ones), statistics.median(twos), statistics.median(ratios)


def _thread_row(path: str, reqs: list[dict[str, np.ndarray]], batch: int) -> Row:
    runner = _native(path, 2)
    one_native, two_native, ratio_native = _scaling(
        lambda: runner.run(reqs[0], ["prob"]), [lambda r=r: runner.run(r, ["prob"]) for r in reqs]
    )
    runner.close()
    pair = [_python_session(path), _python_session(path)]
    one_python, two_python, ratio_python = _scaling(
        lambda: pair[0].run(["prob"], reqs[0]), [lambda s=s, r=r: s.run(["prob"], r) for s, r in zip(pair, reqs)]
    )
    return Row(
        f"C API runner: 2 Python threads vs 1, batch {batch} (median of {WINDOWS} pairs)",
        f"{two_native:,.0f} runs/s (1 thread {one_native:,.0f})",
        f"InferenceSession.run: 2 threads {two_python:,.0f} runs/s (1 thread {one_python:,.0f}), "
        f"ratio {ratio_python:.2f}",
        ratio_native,
    )


def _processor_rows(model: PlainDlrmModel, rng: np.random.Generator) -> list[Row]:
    """Processor.process with its dense run on the C API runner vs on Python sessions
    (RECSERVE_NATIVE_DENSE=0, the path before this change), alternating call by call."""
    processors = {}
    for native in ("1", "0"):
        os.environ["RECSERVE_NATIVE_DENSE"] = native
        processors[native] = Processor(model.config(intra_op_parallelism_threads=1))
    os.environ.pop("RECSERVE_NATIVE_DENSE")
    rows = []
    try:
        for batch, rounds in ((1, 3000), (64, 400), (512, 60)):
            payloads = [encode_request(model.sample(batch, rng)) for _ in range(8)]
            for payload in payloads:
                outs = [decode_response(p.process(payload)[1])["prob"] for p in processors.values()]
                assert np.array_equal(outs[0], outs[1])
            times: dict[str, list[float]] = {"1": [], "0": []}
            for k in range(rounds):
                for key in ("1", "0") if k % 2 else ("0", "1"):
                    t0 = time.perf_counter()
                    processors[key].process(payloads[k % len(payloads)])
                    times[key].append(time.perf_counter() - t0)
            native, python = (statistics.median(times[k]) * 1e6 for k in ("1", "0"))
            rows.append(Row(
                f"Processor.process, plain model with placement (1 dense input), batch {batch} (p50)",
                f"C API runner {native:.0f} us", f"Python sessions {python:.0f} us", python / native,
            ))
    finally:
        for p in processors.values():
            p.close()
    return rows


def run() -> list[Row]:
    global NOTES
    NOTES += f"\n\nLoad average (1 min) when this run started: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores."
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
            seams = [_seam_call(runner, r) for r in reqs]
            sides: dict[str, Callable[[dict[str, np.ndarray], int], Any]] = {
                "ort": lambda r, k: session.run(["prob"], r),
                "native": lambda r, k: runner.run(r, ["prob"]),
                "binding": lambda r, k: session._sess.run(["prob"], r, None),
                "seam": lambda r, k, seams=seams: seams[k](),
            }
            times: dict[str, list[float]] = {name: [] for name in sides}
            order = list(sides)
            for k in range(rounds):
                i = k % len(reqs)
                for name in order[k % 4:] + order[: k % 4]:  # rotate who goes first
                    t0 = time.perf_counter()
                    sides[name](reqs[i], i)
                    times[name].append(time.perf_counter() - t0)
            p50 = {name: statistics.median(t) * 1e6 for name, t in times.items()}
            rows.append(Row(
                f"C API runner via ctypes vs InferenceSession.run, batch {batch}, 1 thread (p50)",
                f"{p50['native']:.0f} us", f"InferenceSession.run {p50['ort']:.0f} us", p50["ort"] / p50["native"],
            ))
            rows.append(Row(
                f"C API run alone (descriptors prebuilt, as native callers pass them) vs the binding's "
                f"run without Python-side checks (InferenceSession._sess.run), batch {batch} (p50)",
                f"{p50['seam']:.0f} us", f"_sess.run {p50['binding']:.0f} us", p50["binding"] / p50["seam"],
            ))
        runner.close()
        rows += [_thread_row(path, [model.sample(batch, rng) for _ in range(2)], batch) for batch in (1, 64)]
        rows += _processor_rows(model, rng)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows
