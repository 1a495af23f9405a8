"""ev_storage_type 12 through the Processor: tables 10x their DRAM budget serve exactly the
checkpoint's values, and a retired version's SSD files go when it is freed."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from recserve import Processor
from recserve.embedding import IMPLEMENTATION
from recserve.errors import StorageError
from recserve.export import TableData, write_checkpoint
from recserve.export.demo import demo_dense, demo_tables, write_demo
from recserve.export.reference import Reference
from recserve.wire.codec import encode_request


def _wait(condition, seconds: float = 10.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return bool(condition())


def test_tiered_tables_serve_the_checkpoint_and_free_retired_files(tmp_path: Path) -> None:
    demo = write_demo(tmp_path / "demo")
    tables = demo_tables()
    biggest = max(t.values.nbytes for t in tables.values())
    ssd = tmp_path / "ssd"
    config = json.loads(demo.config_path.read_text()) | {
        "ev_storage_type": 12, "ev_storage_path": str(ssd),
        "ev_storage_size": [biggest // 10, 64 << 20], "model_update_interval_seconds": 0.05,
    }
    processor = Processor(config)
    try:
        served = processor._manager.current
        assert served is not None
        for name, table in served.tables.items():
            stats = table.tier_stats()
            assert stats is not None and stats["ssd_live_records"] == len(tables[name].keys), (name, stats)
            if tables[name].values.nbytes >= biggest:  # 10x its DRAM budget
                assert stats["dram_rows"] <= len(tables[name].keys) // 10, (name, stats)
        reference = Reference(demo.model_dir, demo.version_dir)
        rng = np.random.default_rng(8)
        for _ in range(200):
            request = demo.sample_inputs(int(rng.integers(1, 17)), rng)
            got, want = processor.predict(request), reference.predict(request)
            for alias in want:
                assert float(np.abs(got[alias] - want[alias]).max()) <= 1e-6
        # Over the wire the tiered tables take the native route (their lookups are the engine's).
        data = encode_request(demo.sample_inputs(4, rng))
        processor.process(data)   # the layout's first request: validated in Python
        served_before = processor.model_info()["native_route"]["served"]
        assert processor.process(data) == processor.process_python(data)
        assert processor.model_info()["native_route"]["served"] == served_before + 1
        assert (ssd / "default" / "1").is_dir()

        scaled = {name: TableData(t.keys, t.values * 2) for name, t in tables.items()}
        write_checkpoint(demo.checkpoint_dir, scaled, global_step=2, dense=demo_dense())
        assert _wait(lambda: processor.model_info()["version"] == "2")
        assert _wait(lambda: not (ssd / "default" / "1").exists())  # version 1 freed with its files
        request = demo.sample_inputs(8, rng)
        want = Reference(demo.model_dir, demo.checkpoint_dir / "2").predict(request)
        got = processor.predict(request)
        for alias in want:
            assert float(np.abs(got[alias] - want[alias]).max()) <= 1e-6
    finally:
        processor.close()
    assert _wait(lambda: not (ssd / "default" / "2").exists())


_RSS_CHILD = """
import json, sys, threading
import onnxruntime  # noqa: F401  (imported before measuring: not the table's memory)
from recserve import Processor

def anon() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("RssAnon:"))

# The kernel keeps no peak of anonymous memory alone (VmHWM counts mapped file pages too):
# sample it while the version loads.
peak, done = [anon()], threading.Event()

def sample() -> None:
    while not done.wait(0.002):
        peak.append(anon())

before = anon()
sampler = threading.Thread(target=sample)
sampler.start()
processor = Processor(json.loads(sys.argv[1]))
done.set()
sampler.join(60)
assert not sampler.is_alive(), "the RssAnon sampler did not stop in 60 s"
stats = processor._manager.current.tables["big"].tier_stats()
print(json.dumps({"growth": max(peak) - before, "samples": len(peak) - 1,
                  "ssd_live_records": stats["ssd_live_records"]}))
processor.close()
"""


@pytest.mark.skipif(IMPLEMENTATION != "native", reason="memory use is the native engine's; the twin is a spec")
def test_a_table_bigger_than_its_memory_never_sits_in_memory_whole(tmp_path: Path, one_big_table) -> None:
    """Loading a tiered table from a checkpoint streams its rows from the file's mapping into
    the SSD tier: the peak of the process's anonymous memory while the version loads grows
    by the index, the keys and the DRAM budget, not by the table (here 160 MB of rows; the
    page cache does not count)."""
    import subprocess
    import sys

    rows, dim = 312_500, 128  # 160 MB of float32 rows
    model_dir, _ = one_big_table(rows, dim)
    config = {
        "savedmodel_dir": str(model_dir), "checkpoint_dir": str(tmp_path / "ckpt"),
        "ev_storage_type": 12, "ev_storage_path": str(tmp_path / "ssd"), "ev_storage_size": [8 << 20, 1 << 30],
    }
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, json.dumps(config)], capture_output=True, text=True,
                         check=True, timeout=600)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ssd_live_records"] == rows
    assert result["samples"] > 10, result  # the sampler ran while the version loaded
    table_bytes = rows * dim * 4
    assert result["growth"] < table_bytes // 4, (result, table_bytes)


def test_a_version_that_fails_to_build_lets_go_of_its_files_at_once(tmp_path: Path) -> None:
    """A tiered table that cannot be built (here: over its SSD budget; in the soak: a full
    disk) must not keep the failed version's files open until Python's cyclic collector
    happens to run: an error returned from a loading thread held them in a cycle."""
    import gc
    import os

    demo = write_demo(tmp_path / "demo")
    tables = demo_tables()
    user = tables["user"]
    budget = 2 * len(user.keys) * (8 + 4 * user.dim)
    config = json.loads(demo.config_path.read_text()) | {
        "ev_storage_type": 12, "ev_storage_path": str(tmp_path / "ssd"),
        "ev_storage_size": [1 << 20, budget], "model_update_interval_seconds": 3600,
    }
    processor = Processor(config)
    big = np.arange(4 * len(user.keys), dtype=np.int64)
    version = write_checkpoint(demo.checkpoint_dir, {
        **tables, "user": TableData(big, np.ones((len(big), user.dim), np.float32))}, global_step=2)

    def open_files_of_version() -> list[str]:
        found = []
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith(str(version)):
                found.append(target)
        return found

    gc.collect()
    gc.disable()
    try:
        with pytest.raises(StorageError, match="ssd_bytes budget") as caught:
            processor._updater.poll_once()
        del caught  # its traceback holds the loader's frames (not a cycle: freed here)
        info = processor.model_info()
        assert info["version"] == "1" and "ssd_bytes budget" in info["last_error"], info
        assert open_files_of_version() == []
    finally:
        gc.enable()
        processor.close()
