"""Loading a version's table files (issue "full version swaps without doubling memory", part
4): a Processor's ready time per GiB of files, on one load thread and on the default number,
beside the machine's own rates for reading the same files and for sha256 on one core."""

from __future__ import annotations

import hashlib
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.models import build_dlrm
from benchmarks.report import Row
from recserve import Processor
from recserve.model_store import load_threads

TOTAL_ROWS = 16_000_000  # 26 tables x ~615k rows x 16 floats: ~1.0 GiB of rows, ~1.4 GiB of files
NOTES = """DLRM-like model (26 tables, 16M rows x 16 in all, random int64 keys; files hold keys, values,
freqs and versions), page cache warm (every file read once before timing). Read: the files read
whole, one after another, on one thread. sha256: `hashlib.sha256` over the same bytes on one
thread. Ready: `Processor(config)` from the call to its return, best of 2: list and verify every
file's size and sha256, map the tables' rows, copy them into the engine's layout and build the
hash indexes, create the ORT session, warm up. "1 thread" forces
`recserve.model_store.load_threads` to one thread; "default" uses min(8, cores)."""


def _rate(total: int, seconds: float) -> float:
    return total / 2**30 / seconds


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-loading-"))
    try:
        model = build_dlrm(root, total_rows=TOTAL_ROWS)
        files = sorted(model.checkpoint_dir.rglob("*.safetensors"))
        total = sum(f.stat().st_size for f in files)
        for f in files:
            f.read_bytes()
        started = time.perf_counter()
        for f in files:
            f.read_bytes()
        read = _rate(total, time.perf_counter() - started)
        started = time.perf_counter()
        for f in files:
            hashlib.sha256(f.read_bytes()).digest()
        sha = _rate(total, time.perf_counter() - started)

        def ready(threads: int | None) -> float:
            saved = load_threads._MAX_THREADS
            if threads is not None:
                load_threads._MAX_THREADS = threads
            try:
                best = float("inf")
                for _ in range(2):
                    started = time.perf_counter()
                    processor = Processor(model.config())
                    best = min(best, time.perf_counter() - started)
                    processor.close()
                return _rate(total, best)
            finally:
                load_threads._MAX_THREADS = saved

        one, default = ready(1), ready(None)
        machine = f"read {read:.2f} GiB/s, sha256 {sha:.2f} GiB/s (one core)"
        return [
            Row(f"Processor ready, {total / 2**30:.2f} GiB of table files, 1 load thread", f"{one:.2f} GiB/s",
                machine, one / sha),
            Row(f"Processor ready, {total / 2**30:.2f} GiB of table files, {load_threads.load_threads()} load threads",
                f"{default:.2f} GiB/s", machine, default / sha, ">= 1 GiB/s", default >= 1.0),
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
