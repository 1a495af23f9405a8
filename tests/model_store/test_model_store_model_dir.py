import onnx
import pytest
from onnx import TensorProto, helper

from recserve.errors import ModelLoadError
from recserve.export import write_model_dir
from recserve.model_spec import EmbeddingBinding, ModelSpec, SignatureSpec, parse_model_spec
from recserve.model_store import LocalStorage, load_model_dir

STORAGE = LocalStorage()
SPEC = ModelSpec(
    embeddings=(EmbeddingBinding("user_id", "user", 4, "user_emb", combiner="mean"),),
    signatures={"serving_default": SignatureSpec({"uid": "user_id"}, {"out": "y"})},
)


def _graph():
    graph = helper.make_graph(
        [helper.make_node("Identity", ["user_emb"], ["y"])],
        "g",
        [helper.make_tensor_value_info("user_emb", TensorProto.FLOAT, ["b", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def test_spec_from_model_json(tmp_path):
    write_model_dir(tmp_path / "m", _graph(), SPEC)
    model_dir = load_model_dir(STORAGE, str(tmp_path / "m"))
    assert model_dir.onnx_path == f"{tmp_path}/m/model.onnx"
    assert model_dir.spec == SPEC
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.json", "model.onnx"]


def test_spec_from_onnx_metadata(tmp_path):
    write_model_dir(tmp_path / "m", _graph(), SPEC, spec_in_metadata=True)
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["model.onnx"]
    assert load_model_dir(STORAGE, str(tmp_path / "m")).spec == SPEC


def test_model_json_wins_over_metadata(tmp_path):
    write_model_dir(tmp_path / "m", _graph(), SPEC, spec_in_metadata=True)
    (tmp_path / "m" / "model.json").write_text('{"embeddings": []}')
    assert load_model_dir(STORAGE, str(tmp_path / "m")).spec == ModelSpec()


def test_plain_onnx_model_has_an_empty_spec(tmp_path):
    (tmp_path / "m").mkdir()
    onnx.save_model(_graph(), tmp_path / "m" / "model.onnx")
    assert load_model_dir(STORAGE, str(tmp_path / "m")).spec == ModelSpec()


def test_missing_model_onnx_names_the_dir_and_its_contents(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.json").write_text("{}")
    (tmp_path / "m" / "variables").mkdir()
    with pytest.raises(ModelLoadError) as err:
        load_model_dir(STORAGE, str(tmp_path / "m"))
    assert str(err.value) == (
        f"savedmodel_dir {tmp_path}/m has no model.onnx (recserve's format) or saved_model.pb (a TensorFlow "
        "SavedModel); it contains ['model.json', 'variables']"
    )
    with pytest.raises(ModelLoadError, match=r"or saved_model.pb \(a TensorFlow SavedModel\); it does not exist"):
        load_model_dir(STORAGE, str(tmp_path / "absent"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="; it is empty"):
        load_model_dir(STORAGE, str(tmp_path / "empty"))


def test_invalid_model_json_names_the_file(tmp_path):
    write_model_dir(tmp_path / "m", _graph(), SPEC)
    (tmp_path / "m" / "model.json").write_text('{"embedding": []}')
    with pytest.raises(ModelLoadError) as err:
        load_model_dir(STORAGE, str(tmp_path / "m"))
    assert str(err.value) == (
        f"{tmp_path}/m/model.json: unknown key(s) ['embedding']; "
        "valid keys are ['checkpoint_names', 'embeddings', 'signatures']"
    )


def test_unreadable_onnx_without_model_json(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.onnx").write_bytes(b"\xff\xff not a protobuf")
    with pytest.raises(ModelLoadError, match=r"model.onnx: not a readable ONNX model \("):
        load_model_dir(STORAGE, str(tmp_path / "m"))


def test_model_json_nested_too_deeply_is_a_load_error():
    # json raises RecursionError, not ValueError, on deep nesting (see tests/fuzz/).
    with pytest.raises(ModelLoadError, match=r"model.json: not valid JSON \(maximum recursion depth"):
        parse_model_spec("[" * 1500)
