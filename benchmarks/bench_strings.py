"""String-keyed requests on the native route (issue #24 follow-up): the string-keyed model of
benchmarks/models.py (`build_string_keyed`: a user id hashed into 10,000 TensorFlow buckets
(farmhash64_mod), an item id keyed by XXH64, 5 ''-padded tags per sample hashed into 1,000
buckets and mean-pooled, a genre and 5 topics keyed by a vocabulary, 4 dense features, MLP
84-64-1; dim 16) served by `Processor.process` -- since this change the native route, with
the GIL released -- vs `Processor.process_python`, the Python route every one of these
requests took before (the native route declined hash buckets and vocabularies). Python
threads, session_num = threads, 1 intra-op thread per session; rounds alternate between the
two routes, best of ROUNDS per point."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from benchmarks.models import build_string_keyed
from benchmarks.report import Row
from recserve import Processor
from recserve.wire.codec import encode_request

BATCHES = (1, 64)
THREADS = (1, 2)
ROUNDS = 3
SECONDS = 1.5   # per round and point
NOTES = __doc__.split("\n\n", 1)[1].replace("\n", " ") + (
    " Measured on a 2-core VM shared with up to 7 agents' jobs: the figures are ratios of one interleaved run, "
    "not absolute rates; 2-thread points are the most exposed to the other jobs.")


def _rate(call: Callable[[bytes], tuple[int, bytes]], requests: list[bytes], threads: int, seconds: float) -> float:
    """Requests/s of `threads` Python threads calling `call` for `seconds`."""
    stop = threading.Event()
    counts = [0] * threads
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            i = k
            while not stop.is_set():
                status, body = call(requests[i % len(requests)])
                if status != 200:
                    raise RuntimeError(body[:200])
                counts[k] += 1
                i += 1
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
            stop.set()

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    started = time.perf_counter()
    for t in pool:
        t.start()
    stop.wait(seconds)
    stop.set()
    for t in pool:
        t.join(60)
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return sum(counts) / elapsed


def run() -> list[Row]:
    rows: list[Row] = []
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
                    best = {"native": 0.0, "python": 0.0}
                    for _ in range(ROUNDS):
                        for name, call in (("native", processor.process), ("python", processor.process_python)):
                            best[name] = max(best[name], _rate(call, reqs, threads, SECONDS))
                    natively = processor.model_info()["native_route"]["served"] - served
                    assert natively > 0, "the native route served none of the string-keyed requests"
                    ratio = best["native"] / best["python"]
                    rows.append(Row(
                        name=f"string-keyed model, batch {batch}, {threads} Python thread(s): native route "
                             f"(best of {ROUNDS})",
                        value=f"{best['native']:,.0f} req/s",
                        baseline=f"Python route (process_python) {best['python']:,.0f} req/s",
                        ratio=ratio))
            finally:
                processor.close()
    return rows
