"""Tiered embedding tables: Zipf lookups with a DRAM tier of 10% of the table against the same
table all in DRAM, the LFU and LRU hit rates, and the DRAM budget.

10M rows of dim 16 under random int64 keys (as bench_embedding); the SSD tier's record files
go to a temporary directory (on this machine they stay in the page cache: the figures are
the engine's cost, not a disk's). Tiered tables start with their first rows in DRAM (no
freqs), serve the same stream of fresh Zipf batches, then are measured (see NOTES).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.report import Row
from recserve.embedding import IMPLEMENTATION, EmbeddingTable, TierSpec

ROWS = 10_000_000
DIM = 16
FEATURES, BATCH = 26, 512
ZIPF_A = 1.1
BUDGET = ROWS * DIM * 4 // 10  # 10% of the table's row bytes
WARMUP_BATCHES = 1200  # fresh Zipf batches, the same stream for every table
HIT_RATE_BATCHES = 300  # the next ones: hit rate and admissions measured over these
MEASURED_BATCHES = 32  # then timed

NOTES = f"""\
Table: {ROWS:,} rows x dim {DIM} ({ROWS * DIM * 4 / 2**20:.0f} MiB of rows); DRAM tier budget
{BUDGET / 2**20:.0f} MiB = 10% of that, which holds {BUDGET // (4 * DIM + 24):,} rows (a row plus
24 bytes of slot metadata each). Ids: Zipf({ZIPF_A}) ranks scattered over the rows, batches of
{FEATURES}x{BATCH}, one stream of fresh batches shared by every table. Each tiered table starts
with its first rows in DRAM (no freqs), serves {WARMUP_BATCHES} batches while the eviction
thread admits hot rows, then {HIT_RATE_BATCHES} more over which the hit rate (ids served from
DRAM) and admissions are counted, then {MEASURED_BATCHES} batches timed interleaved with the
all-DRAM table (medians), the eviction thread still running. The static optimum is the Zipf
mass of the ranks that fit in the tier. The SSD tier's files are in a temporary directory and
stay in the page cache on this machine: the figures are the engine's cost, not a disk's.
"pread" reads each SSD row with a system call (~1.3 µs here); "mmap" (the default) copies it
from a read-only mapping of the record file, prefetched like a DRAM row. Index overhead: the
key -> slot index (every key, in DRAM) and fixed bookkeeping, outside the tier budget.
"""


def _zipf_rows(rng: np.random.Generator, shape: tuple[int, ...], scatter: np.ndarray) -> np.ndarray:
    size = int(np.prod(shape))
    ranks = rng.zipf(ZIPF_A, size=size) - 1
    while (too_big := ranks >= ROWS).any():
        ranks[too_big] = rng.zipf(ZIPF_A, size=int(too_big.sum())) - 1
    return scatter[ranks].reshape(shape)


class _Run:
    """One tiered table warmed on the stream, then measured against the all-DRAM table."""

    def __init__(self, table: EmbeddingTable, build: float, dram: EmbeddingTable, stream: np.ndarray) -> None:
        self.build = build
        out = np.empty((FEATURES, BATCH, DIM), np.float32)
        for batch in stream[:WARMUP_BATCHES]:
            table.lookup(batch, out=out)
        before = table.tier_stats()
        for batch in stream[WARMUP_BATCHES : WARMUP_BATCHES + HIT_RATE_BATCHES]:
            table.lookup(batch, out=out)
        after = table.tier_stats()
        assert before is not None and after is not None
        hits, misses = after["hits"] - before["hits"], after["misses"] - before["misses"]
        self.hit_rate = hits / (hits + misses)
        self.admissions = (after["promotions"] - before["promotions"]) / (HIT_RATE_BATCHES * FEATURES * BATCH)
        self.stats = after
        tiered_times, dram_times = [], []
        expected = np.empty_like(out)
        for batch in stream[WARMUP_BATCHES + HIT_RATE_BATCHES :]:
            start = time.perf_counter()
            table.lookup(batch, out=out)
            tiered_times.append(time.perf_counter() - start)
            start = time.perf_counter()
            dram.lookup(batch, out=expected)
            dram_times.append(time.perf_counter() - start)
            assert np.array_equal(out, expected)
        n = FEATURES * BATCH
        self.rate = n / float(np.median(tiered_times))
        self.dram_rate = n / float(np.median(dram_times))


def _tiered(keys: np.ndarray, values: np.ndarray, root: Path, name: str, **kw: str) -> tuple[EmbeddingTable, float]:
    started = time.perf_counter()
    table = EmbeddingTable(
        name, DIM, keys, values, storage=TierSpec(dram_bytes=BUDGET, ssd_path=root / name, ssd_bytes=2 << 30, **kw)
    )
    return table, time.perf_counter() - started


def run() -> list[Row]:
    if IMPLEMENTATION != "native":
        raise RuntimeError("bench_tiers measures the native engine; unset RECSERVE_PURE_PYTHON")
    rng = np.random.default_rng(20240612)
    keys = rng.integers(-(2**63), 2**63 - 1, size=ROWS, dtype=np.int64)
    keys[keys == -1] = 0
    values = rng.random((ROWS, DIM), dtype=np.float32)
    scatter = rng.permutation(ROWS)
    batches = WARMUP_BATCHES + HIT_RATE_BATCHES + MEASURED_BATCHES
    stream = keys[_zipf_rows(rng, (batches, FEATURES, BATCH), scatter)]
    weights = np.arange(1, ROWS + 1, dtype=np.float64) ** -ZIPF_A  # ranks beyond ROWS redrawn
    optimum = weights[: BUDGET // (4 * DIM + 24)].sum() / weights.sum()

    started = time.perf_counter()
    dram = EmbeddingTable("dram", DIM, keys, values)
    dram_build = time.perf_counter() - started
    runs: dict[str, _Run] = {}
    with tempfile.TemporaryDirectory(prefix="recserve-tiers-") as tmp:
        root = Path(tmp)
        for label, kw in [("lfu", {"policy": "lfu"}), ("lru", {"policy": "lru"}), ("pread", {"io": "pread"})]:
            table, build = _tiered(keys, values, root, label, **kw)
            runs[label] = _Run(table, build, dram, stream)
            table.close()
    lfu, lru, pread = runs["lfu"], runs["lru"], runs["pread"]
    stats = lfu.stats
    index_per_key = stats["index_bytes"] / ROWS
    rows = [
        Row(
            name="Zipf(1.1) lookups 26x512, DRAM tier = 10% of the table (LFU, mmap), vs all-DRAM",
            value=f"{lfu.rate / 1e6:.1f} M ids/s",
            baseline=f"all-DRAM {lfu.dram_rate / 1e6:.1f} M ids/s",
            ratio=lfu.rate / lfu.dram_rate,
            goal=">= 0.5",
            met=lfu.rate / lfu.dram_rate >= 0.5,
        ),
        Row(
            name="same, SSD rows read with pread instead of mmap",
            value=f"{pread.rate / 1e6:.1f} M ids/s",
            baseline=f"all-DRAM {pread.dram_rate / 1e6:.1f} M ids/s",
            ratio=pread.rate / pread.dram_rate,
        ),
        Row(
            name="DRAM hit rate on Zipf(1.1), 10% budget: LFU (default) vs LRU",
            value=f"LFU {lfu.hit_rate:.1%}",
            baseline=f"LRU {lru.hit_rate:.1%} (static optimum {optimum:.1%})",
            ratio=lfu.hit_rate / lru.hit_rate,
            # The two swap places from run to run; the claim docs/tiers.md makes is that
            # LFU is within 2 points of LRU while making far fewer admissions (next row).
            goal="LFU within 2 points of LRU",
            met=lfu.hit_rate >= lru.hit_rate - 0.02,
        ),
        Row(
            name="admissions (SSD -> DRAM copies) per 1000 ids looked up: LFU vs LRU (ratio = LRU / LFU)",
            value=f"LFU {1000 * lfu.admissions:.1f}",
            baseline=f"LRU {1000 * lru.admissions:.1f}",
            ratio=lru.admissions / lfu.admissions,
        ),
        Row(
            name="DRAM tier bytes used vs its budget (index overhead outside it, per key)",
            value=f"{stats['dram_bytes'] / 2**20:.1f} MiB + index {index_per_key:.1f} B/key",
            baseline=f"budget {BUDGET / 2**20:.1f} MiB",
            ratio=stats["dram_bytes"] / BUDGET,
            goal="<= 1",
            met=stats["dram_bytes"] <= BUDGET,
        ),
        Row(
            name="build the 10M-row table: tiered (records written in chunks) vs all-DRAM (ratio = baseline / ours)",
            value=f"{lfu.build:.2f} s",
            baseline=f"all-DRAM {dram_build:.2f} s",
            ratio=dram_build / lfu.build,
        ),
    ]
    return rows
