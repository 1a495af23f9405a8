"""Redis-backed embedding lookups against the in-process engine (DRAM), same run.

A redis-server is started on a free port (no persistence) for the run and stopped after.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import redis

from benchmarks.redis_server import RedisServer
from benchmarks.report import Row
from recserve.config import ProcessorConfig
from recserve.embedding import EmbeddingTable, LookupPlan
from recserve.embedding.redis_keys import KeySpace, row_keys
from recserve.embedding.redis_store import open_redis_tables
from recserve.model_spec import EmbeddingBinding
from recserve.model_store.checkpoint import Checkpoint, TableData
from recserve.model_store.manifest import Manifest
from recserve.model_store.versions import VersionRef

ROWS = 500_000
DIM = 16
BATCH = 512
CALLS = 300
ZIPF_A = 1.1
CACHE_FRACTION = 0.1

NOTES = f"""\
Table: {ROWS:,} rows x dim {DIM}, random int64 keys, batch {BATCH} ids, one binding, {CALLS}
lookups per case, single request thread, redis-server on localhost (loopback TCP).
DRAM = LookupPlan.run on an EmbeddingTable holding every row. "Cold" = every id of every
batch is fetched from Redis (disjoint batches, cache never hit): the price of one pipelined
MGET round trip. "Zipf" = ids drawn Zipf({ZIPF_A}) over the keys with a local cache of
{CACHE_FRACTION:.0%} of the rows, after one warm-up pass: the steady state of hot-row traffic.
Ratios are Redis latency / DRAM latency (lower is better); the first row compares the cold
path with a bare redis-py MGET of the same 512 keys (the network floor of the design). The Redis store is for tables that
do not fit one machine; DRAM stays the fast path.
"""


def _latencies(fn: Callable[[int], object], calls: int) -> np.ndarray:
    times = np.empty(calls)
    for i in range(calls):
        start = time.perf_counter()
        fn(i)
        times[i] = time.perf_counter() - start
    return times * 1e6


def _rows(name: str, redis_us: np.ndarray, dram_us: np.ndarray) -> list[Row]:
    out = []
    for label, q in (("p50", 50), ("p99", 99)):
        r, d = float(np.percentile(redis_us, q)), float(np.percentile(dram_us, q))
        out.append(Row(f"Redis lookup {label} latency, batch {BATCH}, {name} (x DRAM)",
                       f"{r:,.0f} µs", f"DRAM {d:,.1f} µs", r / d))
    return out


def run() -> list[Row]:
    rng = np.random.default_rng(0)
    keys = rng.choice(2**62, size=ROWS, replace=False).astype(np.int64)
    values = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    workdir = tempfile.mkdtemp(prefix="bench-redis-")
    server = RedisServer(Path(workdir))
    server.start()
    try:
        client = redis.Redis(port=server.port)
        checkpoint = Checkpoint(VersionRef("1", workdir, 1), Manifest("full", 1, {}), {"emb": TableData(keys, values)}, {})
        binding = [EmbeddingBinding("ids", "emb", DIM, "emb_in")]
        config = ProcessorConfig(savedmodel_dir="/unused", feature_store_type="redis",
                                 redis_url=server.url,
                                 redis_cache_rows=int(ROWS * CACHE_FRACTION))
        dram = LookupPlan([(EmbeddingTable("emb", DIM, keys, values.copy()), "none")])
        store = open_redis_tables(binding, checkpoint, config, "bench")
        try:
            plan = store.lookup_plan([("emb", "none")])
            cold = keys[rng.permutation(ROWS)[: CALLS * BATCH]].reshape(CALLS, BATCH)
            ranks = np.minimum(rng.zipf(ZIPF_A, size=(CALLS, BATCH)) - 1, ROWS - 1)
            zipf = keys[rng.permutation(ROWS)][ranks]
            prefix = KeySpace("bench").row_prefix("1", "emb")
            names = [row_keys(prefix, cold[i]) for i in range(CALLS)]
            raw_mget = _latencies(lambda i: client.mget(names[i]), CALLS)
            dram_cold = _latencies(lambda i: dram.run([cold[i]]), CALLS)
            redis_cold = _latencies(lambda i: plan.run([cold[i]]), CALLS)
            _latencies(lambda i: plan.run([zipf[i]]), CALLS)  # warm the cache
            dram_zipf = _latencies(lambda i: dram.run([zipf[i]]), CALLS)
            redis_zipf = _latencies(lambda i: plan.run([zipf[i]]), CALLS)
        finally:
            store.close()
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    r, m = float(np.percentile(redis_cold, 50)), float(np.percentile(raw_mget, 50))
    overhead = Row(f"Redis lookup p50 latency, batch {BATCH}, cold (x one bare redis-py MGET)",
                   f"{r:,.0f} µs", f"MGET {m:,.0f} µs", r / m)
    return [overhead] + _rows("cold (all rows from Redis)", redis_cold, dram_cold) + _rows(
        f"Zipf({ZIPF_A}), cache {CACHE_FRACTION:.0%} of rows", redis_zipf, dram_zipf
    )
