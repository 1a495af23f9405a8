"""`"default": {"rows": file}` in model.json: the .npy file is read with the model dir and
checked (exists, [k >= 1, dim], values float32 holds exactly); every refusal names the
table, the file and what is valid. write_model_dir writes the file from the spec's matrix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from recserve.errors import ModelLoadError
from recserve.export import write_model_dir
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec, parse_model_spec
from recserve.model_store import LocalStorage, load_model_dir

MATRIX = np.arange(12, dtype=np.float32).reshape(3, 4) / 4
VALID = "valid is a .npy file of float32 [k, 4] (k >= 1; another dtype only if float32 holds its values exactly)"


def _graph():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["user_emb"], ["y"])], "g",
        [helper.make_tensor_value_info("user_emb", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def _spec(matrix: np.ndarray | None = MATRIX, rows_file: str = "defaults/user.npy") -> ModelSpec:
    default = DefaultSpec(kind="rows", rows_file=rows_file, matrix=matrix)
    return ModelSpec(embeddings=(EmbeddingBinding("user_id", "user", 4, "user_emb", default=default),))


def _model_dir(tmp_path: Path) -> Path:
    return write_model_dir(tmp_path / "m", _graph(), _spec())


def test_the_matrix_is_written_and_read_back(tmp_path):
    root = _model_dir(tmp_path)
    assert json.loads((root / "model.json").read_text())["embeddings"][0]["default"] == {"rows": "defaults/user.npy"}
    np.testing.assert_array_equal(np.load(root / "defaults" / "user.npy"), MATRIX)
    spec = load_model_dir(LocalStorage(), str(root)).spec
    assert spec == _spec()
    np.testing.assert_array_equal(spec.embeddings[0].default.matrix, MATRIX)
    assert spec.embeddings[0].default.matrix.dtype == np.float32


@pytest.mark.parametrize("saved", [MATRIX.astype(np.float64), np.array([[1, 2, 3, 4]], np.int32)])
def test_other_dtypes_that_float32_holds_exactly_are_accepted(tmp_path, saved):
    root = _model_dir(tmp_path)
    np.save(root / "defaults" / "user.npy", saved)
    matrix = load_model_dir(LocalStorage(), str(root)).spec.embeddings[0].default.matrix
    assert matrix.dtype == np.float32
    np.testing.assert_array_equal(matrix, saved)


def _refusal(root: Path) -> str:
    with pytest.raises(ModelLoadError) as raised:
        load_model_dir(LocalStorage(), str(root))
    return str(raised.value)


def test_a_missing_file_is_refused(tmp_path):
    root = _model_dir(tmp_path)
    (root / "defaults" / "user.npy").unlink()
    assert _refusal(root) == f"table 'user': default rows file 'defaults/user.npy' (in {root}) does not exist; {VALID}"


def test_a_file_that_is_not_npy_is_refused(tmp_path):
    root = _model_dir(tmp_path)
    (root / "defaults" / "user.npy").write_bytes(b"not numpy")
    message = _refusal(root)
    assert message.startswith(f"table 'user': default rows file 'defaults/user.npy' (in {root}) is not a readable "
                              ".npy file (")
    assert message.endswith(f"); {VALID}")


@pytest.mark.parametrize("saved, holds", [
    (np.zeros(4, np.float32), "float32 of shape [4]"),
    (np.zeros((3, 5), np.float32), "float32 of shape [3, 5]"),
    (np.zeros((0, 4), np.float32), "float32 of shape [0, 4]"),
    (np.array([["a"] * 4]), "<U1 of shape [1, 4]"),
])
def test_a_wrong_shape_or_dtype_is_refused(tmp_path, saved, holds):
    root = _model_dir(tmp_path)
    np.save(root / "defaults" / "user.npy", saved)
    assert _refusal(root) == f"table 'user': default rows file 'defaults/user.npy' (in {root}) holds {holds}; {VALID}"


def test_values_float32_cannot_hold_are_refused(tmp_path):
    root = _model_dir(tmp_path)
    np.save(root / "defaults" / "user.npy", np.full((2, 4), 0.1, np.float64))
    assert _refusal(root) == (f"table 'user': default rows file 'defaults/user.npy' (in {root}) holds float64 values "
                              f"that float32 does not hold exactly; {VALID}")


@pytest.mark.parametrize("value", [{"rows": "/abs/d.npy"}, {"rows": "../d.npy"}, {"rows": ""}, {"rows": 3},
                                   {"rows": "d.npy", "seed": 1}])
def test_model_json_refuses_a_path_outside_the_model_dir(value):
    doc = {"embeddings": [{"input": "u", "table": "user", "dim": 4, "default": value}]}
    with pytest.raises(ModelLoadError) as raised:
        parse_model_spec(json.dumps(doc))
    assert str(raised.value) == (
        f"model.json: embeddings[0]: 'default' is {value!r}; valid values are \"zeros\", "
        '{"normal": <stddev >= 0>, "seed": <int>} or {"rows": "<.npy file of float32 [k, dim], a path relative to '
        'the model dir>"}')


def test_bindings_sharing_a_table_must_name_the_same_file():
    doc = {"embeddings": [{"input": "a", "table": "t", "dim": 4, "default": {"rows": "d.npy"}},
                          {"input": "b", "table": "t", "dim": 4, "default": {"rows": "e.npy"}}]}
    with pytest.raises(ModelLoadError, match="with different .dim., .default. or .mod_partitions.; bindings sharing a table must agree on them"):
        parse_model_spec(json.dumps(doc))


def test_writing_a_rows_default_needs_its_matrix(tmp_path):
    with pytest.raises(ModelLoadError) as raised:
        write_model_dir(tmp_path / "m", _graph(), _spec(matrix=None))
    assert str(raised.value) == ("binding of 'user_id': its {\"rows\": 'defaults/user.npy'} default needs its matrix "
                                 "(DefaultSpec.matrix), a float32 array of shape [k >= 1, 4]")
    assert not (tmp_path / "m").exists()
