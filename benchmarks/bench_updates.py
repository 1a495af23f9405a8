"""Hot updates (issue "model store backends and hot updates"): request latency while full
versions and deltas land vs steady state in the same run; MANIFEST-to-served time of a
100k-row delta; memory after 20 full swaps vs after 1."""

from __future__ import annotations

import gc
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.models import DlrmModel, build_dlrm
from benchmarks.report import Row
from recserve import Processor
from recserve.export import write_checkpoint, write_delta
from recserve.wire.codec import decode_response, encode_request

INTERVAL = 0.5
CLIENTS = 2
BATCH = 64
REQUEST_PERIOD = 0.01  # each client sends one request per 10 ms: a loaded but not saturated server
PHASE_SECONDS = 4.0
DELTA_ROWS = 100_000
NOTES = f"""Model: 4 tables x 250k rows x 16 (64 MB of rows), 13 dense features, MLP 77-256-64-1;
`session_num` 1, one intra-op thread, polling every {INTERVAL} s. Latency: {CLIENTS} client threads
calling `Processor.process` with batch-{BATCH} requests every {REQUEST_PERIOD * 1000:.0f} ms; steady and update
phases of {PHASE_SECONDS:.0f} s alternate three times; an update phase lands one full version (all 1M rows
re-written, verified, loaded, warmed up, swapped) and {DELTA_ROWS // 1000}k-row deltas. MANIFEST-to-served: a
probe request polls until it sees the delta's rows; the baseline is the polling interval, the goal
two intervals. RSS: VmRSS after the 1st and after the 20th full swap (older versions deleted from
disk as they are replaced)."""


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


class _Bench:
    """Versions and deltas are written ahead into a staging dir and land by one rename, as
    from a trainer on another machine: the server process pays only for its own work."""

    def __init__(self, root: Path) -> None:
        self.model: DlrmModel = build_dlrm(root, n_sparse=4, total_rows=1_000_000, hidden=(256, 64))
        self.staging = root / "staging"
        self.step = 1
        self.version = self.model.checkpoint_dir / "1"
        self.processor = Processor(self.model.config(
            model_update_interval_seconds=INTERVAL, intra_op_parallelism_threads=1, inter_op_parallelism_threads=1))
        self.rng = np.random.default_rng(3)

    def stage_full(self) -> Path:
        self.step += 1
        tables = {f"t{t}": (k, v + np.float32(self.step)) for t, (k, v) in enumerate(zip(self.model.keys, self.model.values))}
        return write_checkpoint(self.staging, tables, global_step=self.step)

    def land_full(self, staged: Path) -> Path:
        self.version = self.model.checkpoint_dir / staged.name
        staged.rename(self.version)
        return self.version

    def full(self) -> Path:
        return self.land_full(self.stage_full())

    def stage_delta(self, base: Path, rows: int) -> Path:
        """A delta of `rows` rows of table t0 on version `base`, written beside it."""
        self.step += 1
        shadow = self.staging / f"shadow-{self.step}"
        shadow.mkdir(parents=True)
        shutil.copy(base / "MANIFEST.json", shadow / "MANIFEST.json")
        keys = self.model.keys[0][:rows]
        values = self.rng.standard_normal((rows, self.model.dim), dtype=np.float32)
        return write_delta(shadow, {"t0": (keys, values)}, global_step=self.step)

    def land_delta(self, staged: Path) -> None:
        parent = self.version / ".incremental_ckpt"
        parent.mkdir(exist_ok=True)
        staged.rename(parent / staged.name)

    def wait_version(self, name: str) -> None:
        deadline = time.monotonic() + 120
        while self.processor.model_info()["version"] != name:
            if time.monotonic() > deadline:
                raise RuntimeError(f"version {name} not served: {self.processor.model_info()}")
            time.sleep(0.01)


def _latencies(bench: _Bench, seconds: float, during: threading.Thread | None) -> list[float]:
    inputs, _ = bench.model.sample(BATCH, np.random.default_rng(1))
    payload = encode_request(inputs)
    out: list[float] = []
    stop = time.monotonic() + seconds

    def client() -> None:
        mine = []
        next_at = time.monotonic()
        while time.monotonic() < stop:
            t = time.perf_counter()
            status, body = bench.processor.process(payload)
            mine.append(time.perf_counter() - t)
            assert status == 200, body[:200]
            next_at += REQUEST_PERIOD
            time.sleep(max(0.0, next_at - time.monotonic()))
        out.extend(mine)

    threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
    for t in threads:
        t.start()
    if during is not None:
        during.start()
    for t in threads:
        t.join()
    if during is not None:
        during.join()
    return out


def _updates(bench: _Bench) -> threading.Thread:
    staged = bench.stage_full()
    deltas = [bench.stage_delta(staged, DELTA_ROWS) for _ in range(3)]

    def land() -> None:
        bench.wait_version(bench.land_full(staged).name)
        for delta in deltas:
            bench.land_delta(delta)
            time.sleep(INTERVAL)

    return threading.Thread(target=land)


def _served_after(bench: _Bench) -> float:
    probe = {"dense": np.zeros((1, bench.model.n_dense), np.float32),
             **{f"C{t}": bench.model.keys[t][:1] for t in range(bench.model.n_sparse)}}
    payload = encode_request(probe)
    staged = bench.stage_delta(bench.version, DELTA_ROWS)
    before = decode_response(bench.processor.process(payload)[1])["prob"]
    bench.land_delta(staged)
    landed = time.monotonic()
    while time.monotonic() - landed < 60:
        if not np.array_equal(decode_response(bench.processor.process(payload)[1])["prob"], before):
            return time.monotonic() - landed
        time.sleep(0.002)
    raise RuntimeError("delta not served within 60 s")


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-updates-"))
    try:
        bench = _Bench(root)
        _latencies(bench, 1.0, None)  # warm
        steady: list[float] = []
        updating: list[float] = []
        for _ in range(3):
            steady += _latencies(bench, PHASE_SECONDS, None)
            updating += _latencies(bench, PHASE_SECONDS, _updates(bench))
        p99_steady = float(np.percentile(steady, 99)) * 1e3
        p99_updating = float(np.percentile(updating, 99)) * 1e3
        ratio = p99_updating / p99_steady

        delays = [_served_after(bench) for _ in range(5)]
        served = float(np.median(delays))

        rss: list[float] = []
        for i in range(20):
            previous = bench.version
            bench.wait_version(bench.full().name)
            shutil.rmtree(previous)
            gc.collect()
            rss.append(_rss_mb())
        growth = rss[-1] / rss[0]
        bench.processor.close()
        return [
            Row("p99 latency during updates / steady state (batch 64)", f"{p99_updating:.2f} ms",
                f"steady {p99_steady:.2f} ms", ratio, "<= 1.3", ratio <= 1.3),
            Row(f"MANIFEST to served, {DELTA_ROWS // 1000}k-row delta (median of 5; max {max(delays):.2f} s)",
                f"{served:.3f} s", f"polling interval {INTERVAL} s", served / INTERVAL, "<= 2", served <= 2 * INTERVAL),
            Row("RSS after 20 full swaps / after 1", f"{rss[-1]:.0f} MB", f"{rss[0]:.0f} MB", growth, "<= 1.05",
                growth <= 1.05),
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
