"""Lookups against a plain numpy reference: every shape and combiner, padding, unknown keys,
the `out` buffer, LookupPlan, and the errors callers see."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from recserve.embedding import _native, _pure
from recserve.errors import RequestError
from recserve.model_spec import DefaultSpec

DIM = 6
NORMAL = DefaultSpec(kind="normal", stddev=0.1, seed=99)


def make_rows(n: int = 200, dim: int = DIM, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.permutation(np.unique(rng.integers(-(2**62), 2**62, size=n)))  # sparse, no -1
    return keys.astype(np.int64), rng.standard_normal((len(keys), dim)).astype(np.float32)


def reference_rows(keys, values, ids, default: DefaultSpec, engine) -> np.ndarray:
    """[*ids.shape, dim] by a dict lookup, one id at a time."""
    where = {int(k): i for i, k in enumerate(keys)}
    flat = ids.reshape(-1)
    rows = np.zeros((flat.size, values.shape[1]), np.float32)
    for i, key in enumerate(flat.tolist()):
        if key in where:
            rows[i] = values[where[key]]
        elif key != -1:
            rows[i] = engine.default_vectors(default, np.array([key]), values.shape[1])[0]
    return rows.reshape(*ids.shape, values.shape[1])


def reference_pool(rows: np.ndarray, ids: np.ndarray, combiner: str) -> np.ndarray:
    """float32 sums in id order, then mean / sqrtn over the non-padding count."""
    out = np.zeros((ids.shape[0], rows.shape[-1]), np.float32)
    for b in range(ids.shape[0]):
        count = 0
        for l in range(ids.shape[1]):
            if ids[b, l] != -1:
                out[b] = out[b] + rows[b, l]
                count += 1
        if count and combiner == "mean":
            out[b] = out[b] / np.float32(count)
        elif count and combiner == "sqrtn":
            out[b] = out[b] / np.sqrt(np.float32(count))
    return out


def request_ids(keys: np.ndarray, shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    """Known keys, unknown keys and padding, mixed."""
    rng = np.random.default_rng(seed)
    choices = np.concatenate([keys, [-1, -1, 5, 123456789, -(2**63), 2**63 - 1]])
    return rng.choice(choices, size=shape).astype(np.int64)


@pytest.mark.parametrize("default", [DefaultSpec(), NORMAL], ids=["zeros", "normal"])
@pytest.mark.parametrize("shape", [(9,), (5, 1), (7, 4), (0,), (3, 0)])
def test_lookup_none_equals_reference_gather(engine, default, shape) -> None:
    keys, values = make_rows()
    table = engine.EmbeddingTable("t", DIM, keys, values.copy(), default=default)
    ids = request_ids(keys, shape)
    got = table.lookup(ids)
    assert got.dtype == np.float32 and got.shape == (*shape, DIM)
    assert np.array_equal(got, reference_rows(keys, values, ids, default, engine))


@pytest.mark.parametrize("default", [DefaultSpec(), NORMAL], ids=["zeros", "normal"])
@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("shape", [(8, 5), (4, 1), (6,), (0, 3), (2, 0)])
def test_pooled_lookup_equals_reference(engine, default, combiner, shape) -> None:
    keys, values = make_rows()
    table = engine.EmbeddingTable("t", DIM, keys, values.copy(), default=default)
    ids = request_ids(keys, shape, seed=len(shape) * 10 + shape[0])
    grid = ids if ids.ndim == 2 else ids[:, None]
    expected = reference_pool(reference_rows(keys, values, grid, default, engine), grid, combiner)
    got = table.lookup(ids, combiner)
    assert got.shape == (shape[0], DIM)
    assert np.array_equal(got, expected)


def test_padding_and_empty_samples(engine) -> None:
    keys = np.array([10, 20], np.int64)
    values = np.array([[1, 2], [3, 4]], np.float32)
    table = engine.EmbeddingTable("t", 2, keys, values)
    ids = np.array([[10, -1, 20], [-1, -1, -1], [20, -1, -1]], np.int64)
    assert table.lookup(ids).tolist() == [
        [[1, 2], [0, 0], [3, 4]],
        [[0, 0], [0, 0], [0, 0]],
        [[3, 4], [0, 0], [0, 0]],
    ]
    assert table.lookup(ids, "sum").tolist() == [[4, 6], [0, 0], [3, 4]]
    assert table.lookup(ids, "mean").tolist() == [[2, 3], [0, 0], [3, 4]]
    assert table.lookup(np.array([-1, 10], np.int64)).tolist() == [[0, 0], [1, 2]]


def test_unknown_keys_count_toward_mean(engine) -> None:
    table = engine.EmbeddingTable("t", 2, np.array([10], np.int64), np.array([[4, 8]], np.float32))
    assert table.lookup(np.array([[10, 99, -1]], np.int64), "mean").tolist() == [[2, 4]]


def test_engines_agree_bit_for_bit_with_normal_defaults() -> None:
    keys, values = make_rows(500, 16)
    ids = request_ids(keys, (64, 9), seed=5)
    ids[ids == 5] = np.arange(1000, 1000 + int((ids == 5).sum()))  # many distinct unknown keys
    native = _native.EmbeddingTable("t", 16, keys, values.copy(), default=NORMAL)
    twin = _pure.EmbeddingTable("t", 16, keys, values.copy(), default=NORMAL)
    for combiner in ("none", "sum", "mean", "sqrtn"):
        assert native.lookup(ids, combiner).tobytes() == twin.lookup(ids, combiner).tobytes()


def test_lookup_writes_into_out(engine) -> None:
    keys, values = make_rows()
    table = engine.EmbeddingTable("t", DIM, keys, values.copy())
    ids = request_ids(keys, (4, 3))
    out = np.full((4, 3, DIM), 7.0, np.float32)
    assert table.lookup(ids, out=out) is out
    assert np.array_equal(out, reference_rows(keys, values, ids, DefaultSpec(), engine))
    pooled = np.full((4, DIM), 7.0, np.float32)
    assert table.lookup(ids, "sum", out=pooled) is pooled
    assert np.array_equal(pooled, table.lookup(ids, "sum"))


def test_non_contiguous_and_read_only_ids(engine) -> None:
    keys, values = make_rows()
    table = engine.EmbeddingTable("t", DIM, keys, values.copy())
    ids = request_ids(keys, (6, 4))
    expected = table.lookup(np.ascontiguousarray(ids.T))
    assert np.array_equal(table.lookup(ids.T), expected)
    frozen = np.ascontiguousarray(ids.T)
    frozen.flags.writeable = False
    assert np.array_equal(table.lookup(frozen), expected)


def test_lookup_plan_runs_every_binding(engine) -> None:
    keys, values = make_rows()
    users = engine.EmbeddingTable("users", DIM, keys, values.copy(), default=NORMAL)
    items = engine.EmbeddingTable("items", 3, keys[:50], values[:50, :3].copy())
    plan = engine.LookupPlan([(users, "none"), (items, "mean"), (users, "sum"), (items, "none")])
    for batch in (1, 5):
        ids_list = [
            request_ids(keys, (batch,), 1),
            request_ids(keys, (batch, 4), 2),
            request_ids(keys, (batch, 3), 3),
            request_ids(keys[:50], (batch, 2), 4),
        ]
        for _ in range(2):  # the second run reuses the cached layout
            got = plan.run(ids_list)
            expected = [
                users.lookup(ids_list[0]),
                items.lookup(ids_list[1], "mean"),
                users.lookup(ids_list[2], "sum"),
                items.lookup(ids_list[3]),
            ]
            assert [g.shape for g in got] == [e.shape for e in expected]
            assert all(np.array_equal(g, e) for g, e in zip(got, expected))
        outs = [np.empty_like(e) for e in expected]
        assert all(r is o for r, o in zip(plan.run(ids_list, outs), outs))
        assert all(np.array_equal(o, e) for o, e in zip(outs, expected))
    assert engine.LookupPlan([]).run([]) == []


def test_packed_plan_reads_ids_in_place_like_run(engine) -> None:
    keys, values = make_rows()
    users = engine.EmbeddingTable("users", DIM, keys, values.copy(), default=NORMAL)
    items = engine.EmbeddingTable("items", 3, keys[:50], values[:50, :3].copy())
    plan = engine.LookupPlan([(users, "none"), (items, "mean"), (users, "sum"), (items, "none")])
    ids_list = [
        request_ids(keys, (5,), 1),
        request_ids(keys, (5, 4), 2),
        request_ids(keys, (5, 1), 3),
        request_ids(keys[:50], (5, 2), 4),
    ]
    # The ids scattered through one buffer, with other values (and a gap) between them,
    # as the request decoder leaves them; spans given out of order.
    buffer = np.full(64, 123456789, np.int64)
    offsets = [40, 3, 30, 50]
    for offset, ids in zip(offsets, ids_list):
        buffer[offset:offset + ids.size] = ids.reshape(-1)
    layout = plan.packed([(o, ids.shape) for o, ids in zip(offsets, ids_list)])
    before = buffer.copy()
    for _ in range(2):
        got = plan.run_packed(buffer, layout)
        expected = plan.run(ids_list)
        assert [g.shape for g in got] == [e.shape for e in expected] == [(5, DIM), (5, 3), (5, DIM), (5, 2, 3)]
        assert all(np.array_equal(g, e) for g, e in zip(got, expected))
    assert np.array_equal(buffer, before)  # read, never written
    assert engine.LookupPlan([]).run_packed(np.zeros(0, np.int64), engine.LookupPlan([]).packed([])) == []


def test_packed_plan_errors(engine) -> None:
    table = engine.EmbeddingTable("users", 2, np.array([1], np.int64), np.ones((1, 2), np.float32))
    plan = engine.LookupPlan([(table, "none")])
    with pytest.raises(RequestError, match="the plan has 1 bindings but 2 id arrays were given"):
        plan.packed([(0, (1,)), (1, (1,))])
    with pytest.raises(RequestError, match=r"ids for table 'users' must have shape \[B\] or \[B, L\], got shape \[1, 1, 1\]"):
        plan.packed([(0, (1, 1, 1))])
    with pytest.raises(ValueError, match="ids for table 'users': offset must be an integer >= 0, got -1"):
        plan.packed([(-1, (1,))])
    layout = plan.packed([(2, (3,))])
    with pytest.raises(ValueError, match=r"packed ids must be a C-contiguous int64 array of shape \[N\] with N >= 5, got int64 array of shape \[4\]"):
        plan.run_packed(np.ones(4, np.int64), layout)
    with pytest.raises(ValueError, match=r"with N >= 5, got int32 array of shape \[8\]"):
        plan.run_packed(np.ones(8, np.int32), layout)
    with pytest.raises(ValueError, match=r"with N >= 5, got int64 array of shape \[16\] \(non-contiguous\)"):
        plan.run_packed(np.ones(32, np.int64)[::2], layout)
    assert plan.run_packed(np.array([0, 0, 1, -1, 7], np.int64), layout)[0].tolist() == [[1, 1], [0, 0], [0, 0]]


def test_lookup_plan_errors(engine) -> None:
    table = engine.EmbeddingTable("users", 2, np.array([1], np.int64), np.ones((1, 2), np.float32))
    plan = engine.LookupPlan([(table, "none")])
    with pytest.raises(RequestError, match="the plan has 1 bindings but 2 id arrays were given"):
        plan.run([np.array([1]), np.array([1])])
    with pytest.raises(
        RequestError, match="ids for table 'users' must be an int64 numpy array, got int32"
    ):
        plan.run([np.array([1], np.int32)])
    plan.run([np.array([1], np.int64)])  # caches the layout for shape (1,)
    with pytest.raises(
        RequestError, match="ids for table 'users' must be an int64 numpy array, got float64"
    ):
        plan.run([np.array([1.0])])
    with pytest.raises(
        RequestError, match="ids for table 'users' must be an int64 numpy array, got list"
    ):
        plan.run([[1]])
    with pytest.raises(
        ValueError,
        match=r"out for table 'users' must be a writeable C-contiguous float32 array of shape \[1, 2\]",
    ):
        plan.run([np.array([1], np.int64)], [np.empty((1, 3), np.float32)])
    with pytest.raises(ValueError, match="the plan has 1 bindings but 0 out arrays were given"):
        plan.run([np.array([1], np.int64)], [])
    with pytest.raises(
        ValueError, match=r"combiner 'max' is not one of \['none', 'sum', 'mean', 'sqrtn'\]"
    ):
        engine.LookupPlan([(table, "max")])
    with pytest.raises(TypeError, match="binding 0: expected an EmbeddingTable, got str"):
        engine.LookupPlan([("users", "none")])


def test_lookup_errors(engine) -> None:
    table = engine.EmbeddingTable("users", 2, np.array([1], np.int64), np.ones((1, 2), np.float32))
    with pytest.raises(
        RequestError,
        match=r"ids for table 'users' must be an int64 numpy array, got int32 array of shape \[2\]",
    ):
        table.lookup(np.array([1, 2], np.int32))
    with pytest.raises(
        RequestError,
        match=r"ids for table 'users' must have shape \[B\] or \[B, L\], got shape \[1, 1, 1\]",
    ):
        table.lookup(np.ones((1, 1, 1), np.int64))
    with pytest.raises(RequestError, match=r"must have shape \[B\] or \[B, L\], got shape \[\]"):
        table.lookup(np.array(1, np.int64))
    with pytest.raises(ValueError, match=r"combiner 'avg' is not one of"):
        table.lookup(np.array([1], np.int64), "avg")
    ids = np.array([[1, 1]], np.int64)
    bad_outs = {
        "float64 array of shape [1, 2]": np.empty((1, 2)),
        "float32 array of shape [1, 2, 2]": np.empty((1, 2, 2), np.float32),  # shape of "none"
        "float32 array of shape [1, 2] (non-contiguous)": np.empty((1, 4), np.float32)[:, ::2],
    }
    for description, out in bad_outs.items():
        message = f"out for table 'users' must be a writeable C-contiguous float32 array of shape [1, 2], got {description}"
        with pytest.raises(ValueError, match=re.escape(message)):
            table.lookup(ids, "sum", out=out)
    frozen = np.empty((1, 2), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        table.lookup(ids, "sum", out=frozen)


def test_environment_variable_selects_the_twin() -> None:
    code = "import recserve.embedding as e; print(e.IMPLEMENTATION, e.EmbeddingTable.__module__)"
    for value, expected in (
        ("1", "python recserve.embedding._pure"),
        ("", "native recserve.embedding._native"),
    ):
        env = dict(os.environ, RECSERVE_PURE_PYTHON=value)
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        assert done.stdout.split() == expected.split()
