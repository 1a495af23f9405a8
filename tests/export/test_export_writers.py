import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from recserve.errors import CorruptVersionError, ModelLoadError, StorageError, VersionNotReadyError
from recserve.export import TableData, staging, string_key, string_keys, write_checkpoint, write_delta, write_model_dir
from recserve.model_spec import EmbeddingBinding, ModelSpec, SignatureSpec
from recserve.model_store import LocalStorage, list_full_versions

KEYS = np.array([3, 1, 2], dtype=np.int64)
VALUES = np.ones((3, 2), dtype=np.float32)


def test_default_name_is_the_step_and_an_existing_version_is_never_overwritten(tmp_path):
    path = write_checkpoint(tmp_path, {"t": (KEYS, VALUES)}, global_step=5)
    assert path == tmp_path / "5"
    before = (path / "MANIFEST.json").read_bytes()
    with pytest.raises(StorageError) as err:
        write_checkpoint(tmp_path, {"t": (KEYS, VALUES * 2)}, global_step=5)
    assert str(err.value) == (
        f"{tmp_path}/5 already exists; a version or model dir is never overwritten"
    )
    assert (path / "MANIFEST.json").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["5"]


def test_a_failed_write_leaves_nothing_visible(tmp_path, monkeypatch):
    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr("recserve.export.checkpoint_writer.write_manifest", crash)
    with pytest.raises(OSError, match="disk full"):
        write_checkpoint(tmp_path, {"t": (KEYS, VALUES)}, global_step=5)
    assert list(tmp_path.iterdir()) == []


def test_a_writer_killed_before_the_rename_leaves_only_a_hidden_stage(tmp_path, monkeypatch):
    class Killed(BaseException):
        pass

    def die(*args):
        raise Killed

    # A killed process neither renames nor cleans up: everything is written, MANIFEST too.
    monkeypatch.setattr(staging.os, "rename", die)
    monkeypatch.setattr(staging.shutil, "rmtree", lambda *a, **k: None)
    with pytest.raises(Killed):
        write_checkpoint(tmp_path, {"t": (KEYS, VALUES)}, global_step=8)
    (stage,) = tmp_path.iterdir()
    assert stage.name.startswith(".tmp-8-") and (stage / "MANIFEST.json").is_file()
    assert list_full_versions(LocalStorage(), str(tmp_path)) == []


def test_manifest_is_written_last(tmp_path, monkeypatch):
    seen = []
    real = staging.file_entries

    def spy(root):
        seen.append(sorted(p.name for p in root.iterdir()))
        return real(root)

    monkeypatch.setattr("recserve.export.checkpoint_writer.file_entries", spy)
    version = write_checkpoint(tmp_path, {"t": (KEYS, VALUES)}, global_step=1,
                               dense={"w": np.zeros(2, dtype=np.float32)})
    assert seen == [["dense.safetensors", "embedding"]]
    doc = json.loads((version / "MANIFEST.json").read_text())
    assert sorted(doc["files"]) == ["dense.safetensors", "embedding/t.safetensors"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tables": {"t": (KEYS, VALUES.astype(np.float64))}},
         "table 't': values has dtype float64; expected float32"),
        ({"tables": {"t": (np.array([1, -1, 2], dtype=np.int64), VALUES)}},
         "table 't': key -1 is the padding id and cannot be stored"),
        ({"tables": {"t": TableData(KEYS, VALUES, deleted=KEYS)}},
         "table 't': 'deleted' keys belong in a delta (write_delta), not a full version"),
        ({"tables": {"t": [KEYS, VALUES]}},
         "table 't': expected TableData or (keys, values), got list"),
        ({"tables": {"../t": (KEYS, VALUES)}},
         "table name '../t' is invalid: the path must not contain empty, '.' or '..' components"),
        ({"tables": {".t": (KEYS, VALUES)}},
         "table name '.t' is invalid: it must not start with ."),
        ({"tables": {}, "dense": {"w": [1.0]}}, "dense 'w' is a list; expected a numpy array"),
        ({"tables": {}, "dense": {"w": np.array(["a"])}},
         ("dense 'w' has dtype <U1; valid dtypes are ['bool', 'float16', 'float32', 'float64', "
         "'int16', 'int32', 'int64', 'int8', 'uint16', 'uint32', 'uint64', 'uint8']")),
        ({"tables": {}, "name": ".hidden"},
         "version name '.hidden' is invalid; it must be one path component not starting with '.'"),
        ({"tables": {}, "name": "a/b"},
         "version name 'a/b' is invalid; it must be one path component not starting with '.'"),
        ({"tables": {}, "global_step": -3}, "global_step is -3; it must be an integer >= 0"),
    ],
)
def test_invalid_inputs_are_refused_before_anything_is_written(tmp_path, kwargs, message):
    kwargs = {"global_step": 1, **kwargs}
    tables = kwargs.pop("tables")
    with pytest.raises(CorruptVersionError) as err:
        write_checkpoint(tmp_path / "ckpt", tables, **kwargs)
    assert str(err.value) == message
    assert not (tmp_path / "ckpt").exists()


def test_delta_step_must_exceed_the_full_and_existing_deltas(tmp_path):
    version = write_checkpoint(tmp_path, {"t": (KEYS, VALUES)}, global_step=10)
    with pytest.raises(CorruptVersionError) as err:
        write_delta(version, {"t": (KEYS, VALUES)}, global_step=10)
    assert str(err.value) == f"delta global_step 10 must exceed 10, the newest step of {version}"
    write_delta(version, {"t": (KEYS, VALUES)}, global_step=12)
    with pytest.raises(CorruptVersionError, match="delta global_step 11 must exceed 12"):
        write_delta(version, {"t": (KEYS, VALUES)}, global_step=11)


def test_delta_needs_a_complete_full_version(tmp_path):
    (tmp_path / "v").mkdir()
    with pytest.raises(VersionNotReadyError, match="MANIFEST.json is absent"):
        write_delta(tmp_path / "v", {}, global_step=3)


def test_deletion_only_delta(tmp_path):
    version = write_checkpoint(tmp_path, {"t": (KEYS, VALUES)}, global_step=10)
    gone = TableData(np.empty(0, np.int64), np.empty((0, 2), np.float32), deleted=KEYS[:2])
    delta = write_delta(version, {"t": gone}, global_step=11)
    assert sorted(p.name for p in delta.iterdir()) == ["MANIFEST.json", "embedding"]


def _graph():
    graph = helper.make_graph(
        [helper.make_node("Add", ["emb", "x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["b", 2]),
         helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def _spec(graph_input="emb", inputs=None, outputs=None):
    return ModelSpec(
        embeddings=(EmbeddingBinding("ids", "t", 2, graph_input),),
        signatures={"serving_default": SignatureSpec(inputs or {"ids": "ids", "x": "x"},
                                                     outputs or {"y": "y"})},
    )


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (_spec(graph_input="nope"), ("binding of 'ids' feeds graph_input 'nope', which is not a "
                                    "graph input; graph inputs are ['emb', 'x']")),
        (_spec(inputs={"e": "emb"}), ("signature 'serving_default' input 'e' -> 'emb' names no "
                                     "request input; request inputs are ['x', 'ids']")),
        (_spec(outputs={"p": "prob"}), ("signature 'serving_default' output 'p' -> 'prob' names no "
                                       "graph output; graph outputs are ['y']")),
    ],
)
def test_model_dir_spec_is_checked_against_the_graph(tmp_path, spec, message):
    with pytest.raises(ModelLoadError) as err:
        write_model_dir(tmp_path / "m", _graph(), spec)
    assert str(err.value) == message
    assert not (tmp_path / "m").exists()


def test_model_dir_from_bytes_and_path_and_never_overwritten(tmp_path):
    model = _graph()
    write_model_dir(tmp_path / "a", model.SerializeToString(), _spec(), spec_in_metadata=True)
    assert len(model.metadata_props) == 0  # the caller's model is left alone
    write_model_dir(tmp_path / "b", tmp_path / "a" / "model.onnx", _spec())
    loaded = onnx.load(tmp_path / "b" / "model.onnx")
    assert [p.key for p in loaded.metadata_props] == ["recserve"]
    with pytest.raises(StorageError, match="already exists"):
        write_model_dir(tmp_path / "b", model, _spec())
    with pytest.raises(ModelLoadError, match="model is not a readable ONNX model"):
        write_model_dir(tmp_path / "c", b"\xff\xff", _spec())


def test_string_key_is_xxh64_seed0_of_utf8_as_int64():
    # "a" is a published XXH64 test vector (0xd24ec4f1a98c6e5b); "beijing" by python-xxhash.
    assert string_key("beijing") == 2478105073405745052
    assert string_key("a") == 0xD24EC4F1A98C6E5B - (1 << 64)
    assert string_key(b"a") == string_key("a")
    assert string_key("杭州") == string_key("杭州".encode())
    assert string_key("") == -1
    np.testing.assert_array_equal(string_keys(["a", "", "beijing"]),
                                  np.array([string_key("a"), -1, 2478105073405745052]))


def test_model_dir_spec_must_parse_back(tmp_path):
    spec = ModelSpec(embeddings=(EmbeddingBinding("ids", "t", 2, "emb"),
                                 EmbeddingBinding("x", "t", 3, "x")))
    with pytest.raises(ModelLoadError, match=r"^spec: table 't' is bound by 'ids' and 'x'"):
        write_model_dir(tmp_path / "m", _graph(), spec)
