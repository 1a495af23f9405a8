"""A second worker adds no copy of the tables: the whole process tree's Pss (shared pages
counted once in the sum) grows from one process to two workers by what a worker costs on
a tiny model, plus at most 15% of the table bytes on a big one (DESIGN §9; BENCHMARKS.md
has the figures at 1 GB)."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.load_tools import tree_memory
from tests.server.conftest import write_rows_model

pytestmark = pytest.mark.skipif(os.environ.get("RECSERVE_PURE_PYTHON") == "1",
                                reason="worker processes share tables through the native engine")

BIG_ROWS, DIM = 2_000_000, 16  # 122 MiB of rows (and an index of about as much)


def test_second_worker_shares_the_tables(launch, tmp_path):
    pss = {}
    for name, rows in (("tiny", 1000), ("big", BIG_ROWS)):
        config = write_rows_model(tmp_path / name, rows, DIM)
        for workers in (1, 2):
            running = launch(config, workers=workers)
            time.sleep(1.0)
            pss[name, workers] = tree_memory(running.process.pid)["Pss"]
            running.stop()
    table_bytes = BIG_ROWS * DIM * 4
    extra_big = pss["big", 2] - pss["big", 1]
    extra_tiny = pss["tiny", 2] - pss["tiny", 1]
    assert extra_big - extra_tiny <= 0.15 * table_bytes, (pss, extra_big, extra_tiny)
    # And the big model's tables are really there (in the one process: rows + index).
    assert pss["big", 1] - pss["tiny", 1] >= table_bytes, pss
