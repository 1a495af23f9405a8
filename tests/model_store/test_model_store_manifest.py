import hashlib
import json

import numpy as np
import pytest

from recserve.errors import CorruptVersionError, VersionNotReadyError
from recserve.export import write_checkpoint
from recserve.model_store import FileEntry, LocalStorage, Manifest, read_manifest, verify
from recserve.model_store import manifest as manifest_module

STORAGE = LocalStorage()


def _version(tmp_path, rows=100):
    keys = np.arange(1, rows + 1, dtype=np.int64)
    values = np.ones((rows, 4), dtype=np.float32)
    return write_checkpoint(tmp_path / "ckpt", {"user": (keys, values)}, global_step=7)


def _write_manifest(version_dir, doc):
    (version_dir / "MANIFEST.json").write_text(json.dumps(doc))


def test_round_trip_and_files_listed_with_size_and_sha256(tmp_path):
    version = _version(tmp_path)
    manifest = read_manifest(STORAGE, str(version))
    data = (version / "embedding/user.safetensors").read_bytes()
    assert manifest == Manifest(
        kind="full",
        global_step=7,
        files={"embedding/user.safetensors":
               FileEntry(len(data), hashlib.sha256(data).hexdigest())},
    )
    assert Manifest.from_json(json.loads(manifest.dumps())) == manifest
    verify(STORAGE, str(version), manifest)


def test_unknown_top_level_keys_are_ignored(tmp_path):
    version = _version(tmp_path)
    doc = json.loads((version / "MANIFEST.json").read_text())
    doc["created_by"] = "trainer 3"
    _write_manifest(version, doc)
    assert read_manifest(STORAGE, str(version)).global_step == 7


def test_missing_manifest_is_not_ready(tmp_path):
    with pytest.raises(VersionNotReadyError) as err:
        read_manifest(STORAGE, str(tmp_path))
    assert str(err.value) == f"{tmp_path}/MANIFEST.json is absent (the version is not complete yet)"


def test_bad_json_is_corrupt(tmp_path):
    (tmp_path / "MANIFEST.json").write_text('{"kind": "full",')
    with pytest.raises(CorruptVersionError, match=r"MANIFEST.json: not valid JSON \("):
        read_manifest(STORAGE, str(tmp_path))


def test_json_nested_too_deeply_is_corrupt(tmp_path):
    # Found by tests/fuzz/fuzz_checkpoint.py: the json module raises RecursionError here.
    (tmp_path / "MANIFEST.json").write_text("[" * 1500)
    with pytest.raises(CorruptVersionError, match=r"MANIFEST.json: not valid JSON \(maximum recursion depth"):
        read_manifest(STORAGE, str(tmp_path))


GOOD = {"format": "recserve.checkpoint/1", "kind": "full", "global_step": 3,
        "files": {"dense.safetensors": {"size": 1, "sha256": "a" * 64}}}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"format": "recserve.checkpoint/2"},
         "'format' is 'recserve.checkpoint/2'; the supported format is 'recserve.checkpoint/1'"),
        ({"kind": "partial"}, "'kind' is 'partial'; valid values are ['full', 'delta']"),
        ({"global_step": -1}, "'global_step' is -1; it must be an integer >= 0"),
        ({"global_step": "12"}, "'global_step' is '12'; it must be an integer >= 0"),
        ({"global_step": True}, "'global_step' is True; it must be an integer >= 0"),
        ({"files": []}, "'files' must be an object mapping relative path -> {size, sha256}"),
        ({"base_global_step": 1},
         "'base_global_step' is 1; only a delta has one, an integer >= 0 below its global_step 3"),
        ({"kind": "delta", "base_global_step": 3},
         "'base_global_step' is 3; only a delta has one, an integer >= 0 below its global_step 3"),
        ({"kind": "delta", "base_global_step": True},
         "'base_global_step' is True; only a delta has one, an integer >= 0 below its global_step 3"),
        ({"files": {"a": {"size": 1}}},
         "file 'a': expected an object with exactly 'size' and 'sha256'"),
        ({"files": {"a": {"size": -2, "sha256": "a" * 64}}},
         "file 'a': 'size' is -2; it must be an integer >= 0"),
        ({"files": {"a": {"size": 2, "sha256": "A" * 64}}},
         f"file 'a': 'sha256' is '{'A' * 64}'; expected 64 lowercase hex digits"),
        ({"files": {"../other/x": {"size": 2, "sha256": "a" * 64}}},
         "file '../other/x': the path must not contain empty, '.' or '..' components"),
        ({"files": {"embedding/../../x": {"size": 2, "sha256": "a" * 64}}},
         "file 'embedding/../../x': the path must not contain empty, '.' or '..' components"),
        ({"files": {"/etc/passwd": {"size": 2, "sha256": "a" * 64}}},
         "file '/etc/passwd': the path must be relative, with '/' separators"),
        ({"files": {"a\\..\\b": {"size": 2, "sha256": "a" * 64}}},
         "file 'a\\\\..\\\\b': the path must be relative, with '/' separators"),
    ],
)
def test_bad_manifest_fields_are_corrupt_and_named(tmp_path, change, problem):
    _write_manifest(tmp_path, {**GOOD, **change})
    with pytest.raises(CorruptVersionError) as err:
        read_manifest(STORAGE, str(tmp_path))
    assert str(err.value) == f"{tmp_path}/MANIFEST.json: {problem}"


def test_manifest_that_is_not_an_object_is_corrupt(tmp_path):
    _write_manifest(tmp_path, [1, 2])
    with pytest.raises(CorruptVersionError, match="expected a JSON object, got list"):
        read_manifest(STORAGE, str(tmp_path))


def test_missing_file_is_not_ready(tmp_path):
    version = _version(tmp_path)
    manifest = read_manifest(STORAGE, str(version))
    (version / "embedding/user.safetensors").unlink()
    with pytest.raises(VersionNotReadyError) as err:
        verify(STORAGE, str(version), manifest)
    assert str(err.value) == (
        f"{version}/embedding/user.safetensors is missing (listed in MANIFEST.json)"
    )


def test_truncated_file_is_not_ready(tmp_path):
    version = _version(tmp_path)
    manifest = read_manifest(STORAGE, str(version))
    path = version / "embedding/user.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(VersionNotReadyError) as err:
        verify(STORAGE, str(version), manifest)
    assert str(err.value) == f"{path} has 100 of {size} bytes (still being written)"


def test_extra_bytes_are_corrupt(tmp_path):
    version = _version(tmp_path)
    manifest = read_manifest(STORAGE, str(version))
    path = version / "embedding/user.safetensors"
    size = path.stat().st_size
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(CorruptVersionError) as err:
        verify(STORAGE, str(version), manifest)
    assert str(err.value) == f"{path} has {size + 1} bytes; MANIFEST.json lists {size}"


def test_wrong_checksum_is_corrupt(tmp_path):
    version = _version(tmp_path)
    manifest = read_manifest(STORAGE, str(version))
    path = version / "embedding/user.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    expected = manifest.files["embedding/user.safetensors"].sha256
    with pytest.raises(CorruptVersionError) as err:
        verify(STORAGE, str(version), manifest)
    assert str(err.value) == (
        f"{path}: sha256 is {hashlib.sha256(data).hexdigest()}; MANIFEST.json lists {expected}"
    )


def test_verify_refuses_path_traversal_in_a_built_manifest(tmp_path):
    (tmp_path / "secret").write_bytes(b"x")
    manifest = Manifest("full", 1, {"../secret": FileEntry(1, hashlib.sha256(b"x").hexdigest())})
    version = tmp_path / "v"
    version.mkdir()
    with pytest.raises(CorruptVersionError, match=r"file '../secret': the path must not contain"):
        verify(STORAGE, str(version), manifest)


class CountingStorage(LocalStorage):
    def __init__(self):
        self.ranges = []

    def read(self, path):
        raise AssertionError(f"verify read {path} whole")

    def read_range(self, path, start, length):
        self.ranges.append((start, length))
        return super().read_range(path, start, length)


def test_big_files_are_hashed_in_chunks(tmp_path, monkeypatch):
    version = _version(tmp_path, rows=1000)
    manifest = read_manifest(STORAGE, str(version))
    monkeypatch.setattr(manifest_module, "HASH_CHUNK", 4096)
    storage = CountingStorage()
    verify(storage, str(version), manifest)
    size = manifest.files["embedding/user.safetensors"].size
    assert [start for start, _ in storage.ranges] == list(range(0, size, 4096))
    assert max(length for _, length in storage.ranges) == 4096
