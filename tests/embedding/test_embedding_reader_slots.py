"""A worker process killed in the middle of a lookup must not stop its tables' retired rows
from ever being reclaimed: reads count in a slot per process (native/embedding.h), and the
leader forgets a dead worker's slot (shared_memory.forget_reader). Real processes: the
leader's shared arena, a forked reader attached by handle, SIGKILL."""

from __future__ import annotations

import subprocess
import sys

import pytest

from recserve.embedding import IMPLEMENTATION

_CHILD = r"""
import os, signal, sys, time
import numpy as np
from recserve.embedding import EmbeddingTable, shared_memory
from recserve.model_spec import DefaultSpec

shared_memory.reserve(256 << 20)
table = EmbeddingTable("t", 2, np.arange(10), np.zeros((10, 2), np.float32))
table.upsert(np.arange(10), np.ones((10, 2), np.float32))

def churn(times):
    for version in range(times):
        table.upsert(np.arange(10), np.full((10, 2), version, np.float32))
    return table._storage_rows()

def reader():
    shared_memory.detach(0)
    mine = EmbeddingTable.attach("t", 2, table.default, table.handle)
    ids = np.zeros(4_000_000, np.int64)
    while True:
        mine.lookup(ids)  # ~all of the time inside the engine, a read in flight

leaked = False
for attempt in range(20):
    steady = churn(5)
    pid = os.fork()
    if pid == 0:
        try:
            reader()
        finally:
            os._exit(0)
    time.sleep(0.3)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    if churn(40) > steady + 100:  # rows no longer reclaimed: the dead reader's count is stuck
        leaked = True
        break
print("leaked", leaked, "attempts", attempt + 1)
assert leaked, "no SIGKILL landed inside a lookup in 20 attempts"
shared_memory.forget_reader(0)
settled = churn(2)
assert churn(48) == settled, "rows still not reclaimed after forget_reader"
assert table.lookup(np.arange(10)).tolist() == [[47, 47]] * 10
print("ok")
"""


@pytest.mark.skipif(IMPLEMENTATION != "native", reason="the shared arena and reader slots are the native engine's")
def test_a_reader_killed_mid_lookup_is_forgotten_and_rows_are_reclaimed_again() -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD], check=False, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip().endswith("ok"), done.stdout
