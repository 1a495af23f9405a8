import mmap

import numpy as np
import pytest
import safetensors.numpy

from recserve.errors import CorruptVersionError
from recserve.export import TableData, write_checkpoint
from recserve.model_store import (
    LocalStorage,
    list_full_versions,
    load_checkpoint,
    read_manifest,
    read_table,
)

STORAGE = LocalStorage()


class RemoteLikeStorage(LocalStorage):
    """A backend without local paths: tables arrive through `read`."""

    def local_path(self, path):
        return None


def _i64(*values):
    return np.array(values, dtype=np.int64)


def _f32(rows, dim=3):
    return np.arange(rows * dim, dtype=np.float32).reshape(rows, dim)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": np.array([1, 2], dtype=np.int32), "values": _f32(2)},
         "keys has dtype int32; expected int64"),
        ({"keys": [1, 2], "values": _f32(2)}, "keys is a list; expected a numpy array"),
        ({"keys": _i64(1, 2), "values": _f32(2).astype(np.float64)},
         "values has dtype float64; expected float32"),
        ({"keys": _i64(1, 2), "values": np.zeros(2, dtype=np.float32)},
         "values has shape [2]; expected 2 dimension(s)"),
        ({"keys": _i64(1, 2, 3), "values": _f32(2)},
         "values has 2 rows but keys has 3; they must match"),
        ({"keys": _i64(1, 2), "values": _f32(2), "freqs": _i64(1)},
         "freqs has 1 entries but keys has 2; they must match"),
        ({"keys": _i64(1, 2), "values": _f32(2), "versions": _f32(2)},
         "versions has dtype float32; expected int64"),
        ({"keys": _i64(1, 2), "values": _f32(2), "deleted": _i64(1, 2).reshape(1, 2)},
         "deleted has shape [1, 2]; expected 1 dimension(s)"),
        ({"keys": _i64(5, 1, 5, 9, 1), "values": _f32(5)},
         "keys holds 2 duplicate(s), e.g. 1; keys must be unique"),
    ],
)
def test_table_data_validation(kwargs, message):
    with pytest.raises(CorruptVersionError) as err:
        TableData(**kwargs)
    assert str(err.value) == message


def test_tables_and_dense_round_trip(tmp_path):
    user = TableData(keys=_i64(10, 30, 20), values=_f32(3), freqs=_i64(1, 2, 3),
                     versions=_i64(7, 7, 8))
    nested = (_i64(0, 1), _f32(2, dim=4))
    dense = {"deep_w1": np.ones((3, 2), dtype=np.float32), "step": np.array([5], dtype=np.int64)}
    write_checkpoint(tmp_path, {"user": user, "input_layer/item/ev": nested},
                     global_step=42, dense=dense)
    for storage in (STORAGE, RemoteLikeStorage()):
        (ref,) = list_full_versions(storage, str(tmp_path))
        ckpt = load_checkpoint(storage, ref, read_manifest(storage, ref.path))
        assert ckpt.ref.global_step == 42 and ckpt.manifest.kind == "full"
        assert sorted(ckpt.tables) == ["input_layer/item/ev", "user"]
        got = ckpt.tables["user"]
        for name in ("keys", "values", "freqs", "versions"):
            np.testing.assert_array_equal(getattr(got, name), getattr(user, name))
        assert got.deleted is None and got.dim == 3
        np.testing.assert_array_equal(ckpt.tables["input_layer/item/ev"].values, nested[1])
        assert ckpt.tables["input_layer/item/ev"].freqs is None
        assert sorted(ckpt.dense) == ["deep_w1", "step"]
        np.testing.assert_array_equal(ckpt.dense["step"], dense["step"])
    assert (tmp_path / "42/embedding/input_layer/item/ev.safetensors").is_file()


@pytest.mark.parametrize("storage", [STORAGE, RemoteLikeStorage()], ids=["local", "remote"])
def test_table_values_are_read_only_and_tables_copy_them_onto_cache_lines(tmp_path, storage):
    """A local file's values are a read-only view of its mapping (nothing read until used); a
    remote one's are read-only too. A DRAM table copies them once into its own layout (the
    first row on a 64-byte line); either way the rows equal the file's bit for bit."""
    from recserve.embedding import IMPLEMENTATION, EmbeddingTable

    values = np.random.default_rng(1).standard_normal((50, 3)).astype(np.float32)
    path = tmp_path / "t.safetensors"
    safetensors.numpy.save_file({"keys": np.arange(50, dtype=np.int64), "values": values}, str(path))
    got = read_table(storage, str(path))
    assert not got.values.flags.writeable and got.values.tobytes() == values.tobytes()
    if storage is STORAGE:
        owner = got.values
        while isinstance(owner, np.ndarray):
            owner = owner.base
        assert isinstance(owner.obj if isinstance(owner, memoryview) else owner, mmap.mmap)  # the file's mapping
    table = EmbeddingTable("t", 3, got.keys, got.values)
    if IMPLEMENTATION == "native":  # the pure-Python twin keeps its rows its own way
        assert table._values is not None and table._values.ctypes.data % 64 == 0
    assert table.lookup(np.arange(50, dtype=np.int64)).tobytes() == values.tobytes()
    # Values of another dtype are not converted on the way: the table check refuses them.
    safetensors.numpy.save_file({"keys": np.arange(50, dtype=np.int64), "values": values.astype(np.float16)}, str(path))
    with pytest.raises(CorruptVersionError, match="values has dtype float16; expected float32"):
        read_table(storage, str(path))


def test_empty_checkpoint_loads_with_no_tables(tmp_path):
    version = write_checkpoint(tmp_path, {}, global_step=0)
    (ref,) = list_full_versions(STORAGE, str(tmp_path))
    ckpt = load_checkpoint(STORAGE, ref, read_manifest(STORAGE, str(version)))
    assert ckpt.tables == {} and ckpt.dense == {}


def test_unknown_tensor_in_a_table_file_is_corrupt(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors.numpy.save_file({"keys": _i64(1), "values": _f32(1), "weights": _f32(1)}, path)
    with pytest.raises(CorruptVersionError) as err:
        read_table(STORAGE, str(path))
    assert str(err.value) == (
        f"{path}: unknown tensor(s) ['weights']; valid names are "
        "['keys', 'values', 'freqs', 'versions', 'deleted']"
    )


def test_missing_values_tensor_is_corrupt(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors.numpy.save_file({"keys": _i64(1)}, path)
    with pytest.raises(CorruptVersionError, match=r"safetensors: missing tensor\(s\) \['values'\]"):
        read_table(STORAGE, str(path))


def test_invalid_table_contents_name_the_file(tmp_path):
    path = tmp_path / "t.safetensors"
    safetensors.numpy.save_file({"keys": _i64(3, 3), "values": _f32(2)}, path)
    with pytest.raises(CorruptVersionError) as err:
        read_table(STORAGE, str(path))
    assert str(err.value) == f"{path}: keys holds 1 duplicate(s), e.g. 3; keys must be unique"


@pytest.mark.parametrize("storage", [STORAGE, RemoteLikeStorage()], ids=["local", "remote"])
def test_garbage_table_file_is_corrupt(tmp_path, storage):
    path = tmp_path / "t.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00not json")
    with pytest.raises(CorruptVersionError, match=r"safetensors: not a readable safetensors file"):
        read_table(storage, str(path))


def test_with_deltas_applies_them_in_order_as_the_engine_does() -> None:
    """The state a Redis re-import writes: later rows win, a delta's deletions follow its
    upserts, tables the version lacks are skipped."""
    from recserve.model_store.checkpoint import Checkpoint, TableData, with_deltas
    from recserve.model_store.manifest import Manifest
    from recserve.model_store.versions import VersionRef

    def version(step: int, tables: dict[str, TableData]) -> Checkpoint:
        return Checkpoint(VersionRef(str(step), "", step), Manifest("full" if step == 1 else "delta", step, {}),
                          tables, {})

    def rows(*values: float) -> np.ndarray:
        return np.array([[v, v] for v in values], np.float32)

    full = version(1, {"t": TableData(np.array([1, 2, 3], np.int64), rows(1, 2, 3))})
    first = version(2, {"t": TableData(np.array([2, 4], np.int64), rows(20, 40), deleted=np.array([3, 4], np.int64)),
                        "other": TableData(np.array([9], np.int64), rows(9))})
    second = version(3, {"t": TableData(np.array([4, 1], np.int64), rows(400, 100))})
    merged = with_deltas(full, [first, second])
    got = dict(zip(merged.tables["t"].keys.tolist(), merged.tables["t"].values[:, 0].tolist()))
    assert got == {1: 100.0, 2: 20.0, 4: 400.0}  # 3 deleted; 4 upserted and deleted, then back
    assert set(merged.tables) == {"t"} and full.tables["t"].keys.tolist() == [1, 2, 3]  # the input is untouched
