import hashlib
import json
import logging

import numpy as np
import pytest

from recserve.errors import ModelLoadError
from recserve.export import TableData, write_checkpoint, write_delta
from recserve.export.staging import staged_dir, write_manifest
from recserve.model_store import (
    LocalStorage,
    Manifest,
    VersionRef,
    list_deltas,
    list_full_versions,
    newest_complete_version,
    read_manifest,
)

STORAGE = LocalStorage()
LOG = logging.getLogger("test.versions")


def _table(n=10, start=1):
    keys = np.arange(start, start + n, dtype=np.int64)
    return {"t": (keys, np.full((n, 2), start, dtype=np.float32))}


def _refs(ckpt):
    return [(r.name, r.global_step) for r in list_full_versions(STORAGE, str(ckpt))]


def test_full_versions_are_ordered_by_step_then_name(tmp_path):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, _table(), global_step=20, name="model-b")
    write_checkpoint(ckpt, _table(), global_step=100)
    write_checkpoint(ckpt, _table(), global_step=20, name="model-a")
    write_checkpoint(ckpt, _table(), global_step=9)
    assert _refs(ckpt) == [("9", 9), ("model-a", 20), ("model-b", 20), ("100", 100)]
    assert list_full_versions(STORAGE, str(ckpt))[0] == VersionRef("9", f"{ckpt}/9", 9)


def test_listing_skips_files_dirs_without_manifest_deltas_and_dot_names(tmp_path):
    ckpt = tmp_path / "ckpt"
    version = write_checkpoint(ckpt, _table(), global_step=5)
    (ckpt / "being-written").mkdir()
    (ckpt / "README").write_text("not a version")
    (ckpt / "bad").mkdir()
    (ckpt / "bad" / "MANIFEST.json").write_text("{")
    write_delta(version, _table(), global_step=6)
    (ckpt / "misplaced").mkdir()
    write_manifest(ckpt / "misplaced", Manifest("delta", 50, {}))
    assert _refs(ckpt) == [("5", 5)]
    assert list_full_versions(STORAGE, str(tmp_path / "absent")) == []


def test_a_staged_version_is_invisible_until_renamed(tmp_path):
    ckpt = tmp_path / "ckpt"
    with staged_dir(ckpt / "7") as stage:
        write_manifest(stage, Manifest("full", 7, {}))
        assert stage.parent == ckpt and stage.name.startswith(".tmp-7-")
        assert _refs(ckpt) == []
    assert _refs(ckpt) == [("7", 7)]


def test_newest_complete_skips_incomplete_and_corrupt_versions(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    write_checkpoint(ckpt, _table(), global_step=1)
    corrupt = write_checkpoint(ckpt, _table(), global_step=2)
    partial = write_checkpoint(ckpt, _table(), global_step=3)
    (ckpt / "4").mkdir()
    table = corrupt / "embedding/t.safetensors"
    data = bytearray(table.read_bytes())
    data[-1] ^= 1
    table.write_bytes(bytes(data))
    (partial / "embedding/t.safetensors").write_bytes(b"12")
    caplog.set_level(logging.INFO, logger=LOG.name)
    ref, manifest = newest_complete_version(STORAGE, str(ckpt), log=LOG)
    assert ref == VersionRef("1", f"{ckpt}/1", 1)
    assert manifest == read_manifest(STORAGE, str(ckpt / "1"))
    size = len(data)
    listed = read_manifest(STORAGE, str(corrupt)).files["embedding/t.safetensors"].sha256
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", (f"skipping version 4: {ckpt}/4/MANIFEST.json is absent "
                 "(the version is not complete yet)")),
        ("INFO", (f"skipping version 3: {partial}/embedding/t.safetensors has 2 of {size} bytes "
                 "(still being written)")),
        ("WARNING", (f"skipping version 2: {table}: sha256 is {hashlib.sha256(data).hexdigest()}; "
                    f"MANIFEST.json lists {listed}")),
    ]


def test_no_complete_version_names_every_reason(tmp_path):
    ckpt = tmp_path / "ckpt"
    partial = write_checkpoint(ckpt, _table(), global_step=3)
    (partial / "embedding/t.safetensors").unlink()
    (ckpt / "x").mkdir()
    with pytest.raises(ModelLoadError) as err:
        newest_complete_version(STORAGE, str(ckpt), log=LOG)
    assert str(err.value) == (
        f"no complete version in {ckpt}: x: {ckpt}/x/MANIFEST.json is absent (the version is "
        f"not complete yet); 3: {partial}/embedding/t.safetensors is missing (listed in "
        "MANIFEST.json)"
    )


def test_empty_checkpoint_dir(tmp_path):
    with pytest.raises(ModelLoadError) as err:
        newest_complete_version(STORAGE, str(tmp_path), log=LOG)
    assert str(err.value) == f"no complete version in {tmp_path}: it has no version directories"


def _delta_by_hand(version, dir_name, step):
    """A delta as DeepRec's code names its directory."""
    delta = version / dir_name / str(step)
    delta.mkdir(parents=True)
    write_manifest(delta, Manifest("delta", step, {}))


def test_deltas_from_both_directory_names_ordered_by_step(tmp_path):
    version = write_checkpoint(tmp_path / "ckpt", _table(), global_step=10)
    write_delta(version, _table(), global_step=12)
    _delta_by_hand(version, ".incremental_checkpoint", 11)
    write_delta(version, _table(), global_step=14)
    _delta_by_hand(version, ".incremental_checkpoint", 13)
    refs = list_deltas(STORAGE, str(version), after_step=10)
    assert [(r.global_step, r.path) for r in refs] == [
        (11, f"{version}/.incremental_checkpoint/11"),
        (12, f"{version}/.incremental_ckpt/12"),
        (13, f"{version}/.incremental_checkpoint/13"),
        (14, f"{version}/.incremental_ckpt/14"),
    ]
    assert [r.global_step for r in list_deltas(STORAGE, str(version), after_step=12)] == [13, 14]
    assert list_deltas(STORAGE, str(version), after_step=14) == []


def test_a_delta_not_ready_holds_back_later_deltas(tmp_path, caplog):
    version = write_checkpoint(tmp_path / "ckpt", _table(), global_step=10)
    write_delta(version, _table(), global_step=11)
    write_delta(version, _table(), global_step=13)
    (version / ".incremental_ckpt" / "12").mkdir()
    (version / ".incremental_ckpt" / ".tmp-15-abc").mkdir()
    caplog.set_level(logging.INFO, logger=LOG.name)
    refs = list_deltas(STORAGE, str(version), after_step=10, log=LOG)
    assert [r.global_step for r in refs] == [11]
    assert [r.getMessage() for r in caplog.records] == [
        (f"skipping version .incremental_ckpt/12: {version}/.incremental_ckpt/12/MANIFEST.json "
        "is absent (the version is not complete yet)")
    ]
    # Once the served step is past the pending one, it no longer matters.
    assert [r.global_step for r in list_deltas(STORAGE, str(version), after_step=12)] == [13]


def test_delta_rows_round_trip(tmp_path):
    version = write_checkpoint(tmp_path / "ckpt", _table(), global_step=10)
    changed = TableData(keys=np.array([3, 99], dtype=np.int64),
                        values=np.full((2, 2), 7, dtype=np.float32),
                        deleted=np.array([4, 5], dtype=np.int64))
    path = write_delta(version, {"t": changed}, global_step=11)
    assert path == version / ".incremental_ckpt" / "11"
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert manifest["kind"] == "delta" and manifest["global_step"] == 11
    assert list(manifest["files"]) == ["embedding/t.safetensors"]
