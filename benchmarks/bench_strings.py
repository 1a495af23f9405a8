"""String-keyed requests on the native route (issue #24 follow-up): the string-keyed model of
benchmarks/models.py (`build_string_keyed`: a user id hashed into 10,000 TensorFlow buckets
(farmhash64_mod), an item id keyed by XXH64, 5 ''-padded tags per sample hashed into 1,000
buckets and mean-pooled, a genre and 5 topics keyed by a vocabulary, 4 dense features, MLP
84-64-1; dim 16) served by `Processor.process` -- since this change the native route, with
the GIL released -- vs `Processor.process_python`, the Python route every one of these
requests took before (the native route declined hash buckets and vocabularies; before, a
request also paid the native parse that missed, so the baseline is if anything faster than
"before" was). Python threads, session_num = threads, 1 intra-op thread per session; rounds
alternate between the two routes, best of 3 per point. C host rows: the same model and
requests through libserving_processor.so from C threads (tests/cabi/cabi_client.c, no Python
in the host), the native route vs the same library with RECSERVE_NATIVE_ROUTE=0 (the Python
route), interleaved, best of 2, as bench_cabi's scaling rows."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.bench_cabi import _compile_client, _python_rate, c_host_rates
from benchmarks.models import build_string_keyed
from benchmarks.report import Row
from recserve import Processor
from recserve.wire.codec import encode_request

BATCHES = (1, 64)
THREADS = (1, 2)
ROUNDS = 3
SECONDS = 1.5   # per round and point
NOTES = __doc__.replace("\n", " ") + (
    " Measured on a 2-core VM shared with up to 7 agents' jobs: the figures are ratios of one interleaved run, "
    "not absolute rates. The 2 vs 1 thread rows compare points measured tens of seconds apart (not interleaved) and "
    "are the most exposed to the other jobs; with Python threads a batch-1 request's Python part (process(), ctypes) "
    "holds the GIL for most of its ~8 us, so Python threads scale less there than C hosts. 'cores busy' says how "
    "much CPU a C host got: at about 1.0 for 2 threads the other jobs left it one core, and its 2 vs 1 ratio "
    "says nothing about the route (three runs of this module on one day gave native/Python at 1 thread of "
    "9.8-13.9x at batch 1 and 3.2-4.6x at batch 64 for the C host, 5.8-7.0x and 3.0-3.4x for Python threads).")


def run() -> list[Row]:
    best: dict[tuple[str, int, int], float] = {}   # (route, batch, threads) -> req/s
    with tempfile.TemporaryDirectory() as tmp:
        model = build_string_keyed(Path(tmp))
        rng = np.random.default_rng(0)
        requests = {b: [encode_request(model.sample(b, rng)) for _ in range(32)] for b in BATCHES}
        for threads in THREADS:
            processor = Processor(model.config(session_num=threads, intra_op_parallelism_threads=1,
                                               inter_op_parallelism_threads=1))
            try:
                for batch in BATCHES:
                    reqs = requests[batch]
                    for r in reqs:   # register the layout, check both routes agree, warm up
                        assert processor.process(r) == processor.process_python(r)
                    served = processor.model_info()["native_route"]["served"]
                    for _ in range(ROUNDS):
                        for route, call in (("native", processor.process), ("python", processor.process_python)):
                            key = (route, batch, threads)
                            rate = _python_rate(processor, reqs, threads, SECONDS, call)[0]
                            best[key] = max(best.get(key, 0.0), rate)
                    natively = processor.model_info()["native_route"]["served"] - served
                    assert natively > 0, "the native route served none of the string-keyed requests"
            finally:
                processor.close()
    rows = _c_host_rows()
    for threads in THREADS:
        for batch in BATCHES:
            native, python = best[("native", batch, threads)], best[("python", batch, threads)]
            rows.append(Row(
                name=f"string-keyed model, batch {batch}, {threads} Python thread(s): native route (best of {ROUNDS})",
                value=f"{native:,.0f} req/s", baseline=f"Python route (process_python) {python:,.0f} req/s",
                ratio=native / python))
    for batch in BATCHES:
        for route in ("native", "python"):
            one, two = best[(route, batch, 1)], best[(route, batch, 2)]
            rows.append(Row(
                name=f"string-keyed model, batch {batch}, {'native' if route == 'native' else 'Python'} route: "
                     "2 vs 1 Python thread",
                value=f"{two:,.0f} req/s", baseline=f"1 thread {one:,.0f} req/s", ratio=two / one))
    return rows


def _c_host_rows() -> list[Row]:
    rates: dict[tuple[bool, int, int], tuple[float, float]] = {}   # (native, batch, threads) -> (req/s, cores busy)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = build_string_keyed(work / "model")
        binary = _compile_client(work)
        rng = np.random.default_rng(1)
        for batch in BATCHES:
            requests = [encode_request(model.sample(batch, rng)) for _ in range(16)]
            for threads in THREADS:
                config = work / f"config{threads}.json"
                config.write_text(json.dumps(model.config(session_num=threads, intra_op_parallelism_threads=1,
                                                          inter_op_parallelism_threads=1)))
                for native, got in c_host_rates(binary, work, config, requests, threads).items():
                    rates[(native, batch, threads)] = got
    rows = []
    for batch in BATCHES:
        for threads in THREADS:
            (native, busy_n), (python, busy_p) = rates[(True, batch, threads)], rates[(False, batch, threads)]
            rows.append(Row(
                name=f"C host, string-keyed model, batch {batch}, {threads} C thread(s): native route "
                     f"(CPU per request {busy_n / native * 1e6:.1f} vs {busy_p / python * 1e6:.1f} us)",
                value=f"{native:,.0f} req/s", baseline=f"Python route (RECSERVE_NATIVE_ROUTE=0) {python:,.0f} req/s",
                ratio=native / python))
        for native in (True, False):
            (one, busy_one), (two, busy_two) = rates[(native, batch, 1)], rates[(native, batch, 2)]
            rows.append(Row(
                name=f"C host, string-keyed model, batch {batch}, {'native' if native else 'Python'} route: "
                     f"2 vs 1 C thread (cores busy {busy_two:.2f} vs {busy_one:.2f})",
                value=f"{two:,.0f} req/s", baseline=f"1 thread {one:,.0f} req/s", ratio=two / one))
    return rows
