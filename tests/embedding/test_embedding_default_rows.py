"""`{"rows": file}` defaults (DeepRec's Embedding Variable): an unknown key k gets row k mod k'
of a [k', dim] matrix (floor modulo for negative keys), on both engines, DRAM and tiered
tables, pooled or not, after updates and deletes, and in a worker process that attaches a
table built after it forked (the matrix lives in the shared arena). Expected rows come from
Python integer arithmetic on the matrix, never from the engine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from recserve.embedding import IMPLEMENTATION, _native, _pure, tiers
from recserve.embedding.tiers import TierSpec
from recserve.model_spec import DefaultSpec

DIM = 5
MATRIX = np.random.default_rng(3).standard_normal((7, DIM)).astype(np.float32)
ROWS = DefaultSpec(kind="rows", rows_file="defaults/t.npy", matrix=MATRIX)
KEYS = np.array([0, 14, 100, -3, 2**62], dtype=np.int64)
VALUES = np.arange(len(KEYS) * DIM, dtype=np.float32).reshape(len(KEYS), DIM) + 1000
# Unknown keys: positive, negative (floor modulo), the int64 extremes, one next to a stored key.
UNKNOWN = np.array([1, 6, 7, 13, -1 - 1, -7, -8, -(2**63), 2**63 - 1, 101], dtype=np.int64)


def expected(ids: np.ndarray, known: dict[int, np.ndarray]) -> np.ndarray:
    """[*ids.shape, DIM]: stored rows, zeros for padding, MATRIX[k % 7] (Python's floor %)."""
    flat = [int(k) for k in ids.reshape(-1)]
    rows = [known[k] if k in known else np.zeros(DIM, np.float32) if k == -1 else MATRIX[k % len(MATRIX)]
            for k in flat]
    return np.array(rows, np.float32).reshape(*ids.shape, DIM)


def stored() -> dict[int, np.ndarray]:
    return {int(k): v for k, v in zip(KEYS, VALUES)}


def test_an_unknown_key_gets_row_key_mod_k(engine) -> None:
    table = engine.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=ROWS)
    ids = np.concatenate([UNKNOWN, KEYS, [-1]])
    np.testing.assert_array_equal(table.lookup(ids), expected(ids, stored()))
    assert table.lookup(np.array([-2], np.int64))[0].tolist() == MATRIX[5].tolist()  # -2 mod 7 = 5
    assert table.default == ROWS


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_pooled_lookups_add_the_default_rows(engine, combiner) -> None:
    table = engine.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=ROWS)
    ids = np.array([[1, -1, 14, -8], [-1, -1, -1, -1], [7, 2**63 - 1, -1, -1]], np.int64)
    rows = expected(ids, stored())
    want = np.zeros((3, DIM), np.float32)
    for b in range(3):  # float32 sums in id order, then the combiner over the non-padding count
        for position in range(4):
            want[b] += rows[b, position]
        count = int((ids[b] != -1).sum())
        if count and combiner == "mean":
            want[b] /= np.float32(count)
        elif count and combiner == "sqrtn":
            want[b] /= np.sqrt(np.float32(count))
    np.testing.assert_array_equal(table.lookup(ids, combiner), want)


def test_deleted_keys_fall_back_to_their_default_row_and_upserts_replace_it(engine) -> None:
    table = engine.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=ROWS)
    table.delete(np.array([14, -3], np.int64))
    table.upsert(np.array([1], np.int64), np.full((1, DIM), 9, np.float32))
    known = stored()
    del known[14], known[-3]
    known[1] = np.full(DIM, 9, np.float32)
    ids = np.array([14, -3, 1, 8], np.int64)
    np.testing.assert_array_equal(table.lookup(ids), expected(ids, known))


def test_a_lookup_plan_serves_default_rows(engine) -> None:
    table = engine.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=ROWS)
    plain = engine.EmbeddingTable("z", DIM, KEYS, VALUES.copy())
    plan = engine.LookupPlan([(table, "none"), (table, "sum"), (plain, "none")])
    ids = np.array([[3, 14], [-9, -1]], np.int64)
    out = plan.run([ids, ids, ids])
    np.testing.assert_array_equal(out[0], expected(ids, stored()))
    np.testing.assert_array_equal(out[1], expected(ids, stored()).sum(axis=1, dtype=np.float32))
    np.testing.assert_array_equal(out[2][0, 0], np.zeros(DIM, np.float32))  # the zeros table stays zeros


def test_a_tiered_table_serves_default_rows(engine, tmp_path: Path) -> None:
    storage = TierSpec(dram_bytes=2 * (4 * DIM + tiers.SLOT_OVERHEAD), ssd_path=tmp_path / "t", segment_bytes=4096)
    table = engine.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=ROWS, storage=storage)
    try:
        ids = np.concatenate([UNKNOWN, KEYS])
        np.testing.assert_array_equal(table.lookup(ids), expected(ids, stored()))
        np.testing.assert_array_equal(table.lookup(ids[None, :], "sum")[0],
                                      expected(ids, stored()).sum(axis=0, dtype=np.float32))
    finally:
        table.close()


def test_default_vectors_and_the_engines_agree_bit_for_bit() -> None:
    ids = np.concatenate([UNKNOWN, np.arange(-50, 50, dtype=np.int64)])
    ids = ids[ids != -1]
    want = expected(ids, {})
    for engine in (_native, _pure):
        assert engine.default_vectors(ROWS, ids, DIM).tobytes() == want.tobytes()
    native = _native.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=ROWS)
    twin = _pure.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=ROWS)
    grid = ids[: len(ids) // 5 * 5].reshape(-1, 5)
    for combiner in ("none", "sum", "mean", "sqrtn"):
        assert native.lookup(grid, combiner).tobytes() == twin.lookup(grid, combiner).tobytes()


def test_the_table_keeps_its_own_copy_of_the_matrix(engine) -> None:
    matrix = MATRIX.copy()
    table = engine.EmbeddingTable("t", DIM, KEYS, VALUES.copy(),
                                  default=DefaultSpec(kind="rows", rows_file="d.npy", matrix=matrix))
    before = table.lookup(UNKNOWN)
    if engine is _native:  # the native table copied it; the twin reads the (read-only in serving) array
        matrix[:] = 0
        np.testing.assert_array_equal(table.lookup(UNKNOWN), before)


@pytest.mark.parametrize("matrix, got", [
    (None, "NoneType"),
    (MATRIX[:, :3].copy(), "float32 array of shape [7, 3] (C-contiguous)"),
    (MATRIX.astype(np.float64), "float64 array of shape [7, 5] (C-contiguous)"),
    (np.zeros((0, DIM), np.float32), "float32 array of shape [0, 5] (C-contiguous)"),
])
def test_a_rows_default_without_a_valid_matrix_is_refused(engine, matrix, got) -> None:
    spec = DefaultSpec(kind="rows", rows_file="d.npy", matrix=matrix)
    with pytest.raises(ValueError) as raised:
        engine.EmbeddingTable("t", DIM, KEYS, VALUES.copy(), default=spec)
    assert str(raised.value) == ("table 't': a 'rows' default needs its matrix as a C-contiguous float32 array of "
                                 f"shape [k >= 1, {DIM}], got {got}")


_WORKER = r"""
import os, sys
import numpy as np
from recserve.embedding import EmbeddingTable, shared_memory
from recserve.model_spec import DefaultSpec

shared_memory.reserve(64 << 20)
to_worker, from_leader = os.pipe()
to_leader, from_worker = os.pipe()
pid = os.fork()
if pid == 0:  # the worker: forked before the table exists, reads it by handle only
    shared_memory.detach(1)
    handle = int(os.read(to_worker, 64))
    matrix = np.frombuffer(os.read(to_worker, 1 << 16), np.float32).reshape(-1, 3)
    table = EmbeddingTable.attach("t", 3, DefaultSpec(kind="rows", rows_file="d.npy", matrix=matrix), handle)
    ids = np.array([5, -5, 2**63 - 1, 42], np.int64)
    got = table.lookup(ids)
    want = np.array([matrix[int(k) % len(matrix)] for k in ids[:3]] + [[1, 2, 3]], np.float32)
    os.write(from_worker, b"ok" if np.array_equal(got, want) else repr(got).encode())
    os._exit(0)
matrix = np.arange(1, 13, dtype=np.float32).reshape(4, 3) / 8
table = EmbeddingTable("t", 3, np.array([42]), np.array([[1, 2, 3]], np.float32),
                       default=DefaultSpec(kind="rows", rows_file="d.npy", matrix=matrix.copy()))
os.write(from_leader, str(table.handle).encode().ljust(64))
os.write(from_leader, matrix.tobytes())
answer = os.read(to_leader, 1 << 16).decode()
os.waitpid(pid, 0)
print(answer)
"""


@pytest.mark.skipif(IMPLEMENTATION != "native", reason="the shared arena is the native engine's")
def test_a_worker_forked_before_the_table_was_built_reads_its_default_rows() -> None:
    done = subprocess.run([sys.executable, "-c", _WORKER], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert done.stdout.strip() == "ok", done.stdout
