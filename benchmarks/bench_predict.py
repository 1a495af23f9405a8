"""`Processor.predict(arrays)` in process -- what the KServe v2 and TF Serving REST handlers
call after parsing JSON -- on the native route (recserve.processor.native_predict) against
the Python route it took before, and against the EAS bytes way round (encode_request,
process, decode_response)."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.models import build_plain_dlrm
from benchmarks.report import Row
from recserve import Processor
from recserve.export.demo import write_demo
from recserve.processor import native_predict
from recserve.wire.codec import decode_response, encode_request

WINDOW = 0.3
WINDOWS = 11
BATCHES = (1, 64, 512)
NOTES = f"""Models: the demo model (`recserve.export.demo`: 6 id inputs over 5 tables, one of
them strings, 3 float inputs, two [B, 1] float outputs) and the plain DLRM-like ONNX file of
bench_processor (26 Gathers on [40000, 16] initializers, 13 dense features, MLP
429-512-256-1, served with enable_device_placement_optimization), 1 intra-op thread.
One thread calls `Processor.predict(arrays)` with the native hand-off on (after) and off
(before: `Servable.predict`, the Python route), and `decode_response(process(encode_request(
arrays)))` (the bytes way round), the sides alternating window by window ({WINDOWS} windows
of {WINDOW} s each, rotating which goes first); the figure is the process's CPU time per
call (time.process_time: wall time on a loaded machine mostly measures the other agents),
the median window's.
Outputs are checked equal first. The machine is shared with other agents (load average in
each row's name): compare the ratios, not the absolute figures.
Why this hand-off: the bytes way round (the PredictRequest encoder of today, then the
native `process`, then `decode_response`) already beats the Python route at batch 1 on
the demo but loses on the 27-input DLRM model (encode_request builds protobuf objects for
int64 and string inputs); handing the C route the parser's own layout and values buffer
skips both the encoding and the parse (values packed by one `tobytes` per input, strings
spanned into one buffer), and float outputs are read from the response bytes by a plan
cached per layout (integer/bool outputs by the generated parser)."""


def _per_call(fn: Callable[[], Any]) -> float:
    """CPU time per call over a window (the process's: a loaded machine stretches wall time
    by however long other agents hold the cores)."""
    calls, start, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        fn()
        calls += 1
        if time.perf_counter() - start >= WINDOW:
            return (time.process_time() - cpu) / calls * 1e6


def _sides(processor: Processor, inputs: dict[str, np.ndarray]) -> dict[str, Callable[[], Any]]:
    process = native_predict._process_values

    def before() -> Any:
        native_predict._process_values = None
        try:
            return processor.predict(inputs)
        finally:
            native_predict._process_values = process

    return {
        "after": lambda: processor.predict(inputs),
        "before": before,
        "bytes": lambda: decode_response(processor.process(encode_request(inputs, ""))[1]),
    }


def _measure(processor: Processor, inputs: dict[str, np.ndarray]) -> dict[str, float]:
    sides = _sides(processor, inputs)
    want = sides["before"]()
    for name, fn in sides.items():
        got = fn()
        assert set(got) == set(want), name
        for key in want:
            assert got[key].dtype == want[key].dtype and np.array_equal(got[key], want[key]), (name, key)
    served = processor.model_info()["native_route"]["served"]
    sides["after"]()
    assert processor.model_info()["native_route"]["served"] == served + 1, "predict was not served natively"
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides)
    for w in range(WINDOWS):
        for name in order[w % 3:] + order[:w % 3]:
            times[name].append(_per_call(sides[name]))
    return {name: statistics.median(values) for name, values in times.items()}


def _rows(label: str, processor: Processor, sample: Callable[[int, np.random.Generator], dict[str, np.ndarray]]
          ) -> list[Row]:
    rows = []
    rng = np.random.default_rng(1)
    for batch in BATCHES:
        got = _measure(processor, sample(batch, rng))
        load = os.getloadavg()[0]
        rows.append(Row(
            f"{label}, batch {batch}: predict native vs Python route, speedup (bytes way round "
            f"{got['bytes']:,.1f} us; load {load:.1f})",
            f"{got['after']:,.1f} us", f"Python route {got['before']:,.1f} us", got["before"] / got["after"],
            ">= 1", got["before"] / got["after"] >= 1))
    return rows


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-predict-"))
    try:
        demo = write_demo(root / "demo")
        processor = Processor(demo.config())
        try:
            rows = _rows("demo model", processor, demo.sample_inputs)
        finally:
            processor.close()
        plain = build_plain_dlrm(root / "plain")
        processor = Processor(plain.config(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1))
        try:
            rows += _rows("plain DLRM", processor, plain.sample)
        finally:
            processor.close()
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
