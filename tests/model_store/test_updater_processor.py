"""The updater inside `Processor`: rollback through `load_version`, model info, pinning from
the config, and a version landing while the processor runs its own polling thread."""

from __future__ import annotations

import time

import numpy as np
import pytest
from onnx import TensorProto, helper

from recserve import Processor
from recserve.errors import ConfigError, VersionNotReadyError
from recserve.export import write_model_dir
from recserve.model_spec import ModelSpec
from recserve.wire.codec import decode_model_info


def _score(processor: Processor, keys: np.ndarray) -> np.ndarray:
    return processor.predict({"item_id": keys})["score"]


def test_load_version_rolls_back_and_model_info_reports_the_update_state(tiny):
    tiny.write_full(1, tag=10, w=1)
    v2 = tiny.write_full(2, tag=20, w=2)
    tiny.write_delta(v2, 3, tag=30)
    processor = Processor(tiny.config(model_update_interval_seconds=0.05))
    try:
        info = processor.model_info()
        assert (info["version"], info["global_step"], info["delta_step"], info["pinned_version"]) == ("2", 2, 3, None)
        assert (info["full_updates"], info["delta_updates"], info["last_error"]) == (1, 1, None)
        assert info["update_failures"] == {"storage": 0, "not_ready": 0, "corrupt": 0, "wrong_base": 0,
                                           "load": 0, "memory": 0, "internal": 0}
        wire = decode_model_info(processor.model_info_bytes())
        assert (wire["model_version"], wire["global_step"], wire["delta_step"]) == ("2", 2, 3)
        assert wire["update_time"] == pytest.approx(time.time(), abs=60)
        np.testing.assert_array_equal(_score(processor, tiny.keys), tiny.expected(tiny.keys, 30, 2))

        info = processor.load_version("1")
        assert (info["version"], info["pinned_version"], info["delta_step"]) == ("1", "1", 0)
        np.testing.assert_array_equal(_score(processor, tiny.keys), tiny.expected(tiny.keys, 10, 1))
        with pytest.raises(VersionNotReadyError, match=r"^version '9' is not in "):
            processor.load_version("9")
        info = processor.load_version(None)
        assert (info["version"], info["pinned_version"], info["delta_step"]) == ("2", None, 3)
        np.testing.assert_array_equal(_score(processor, tiny.keys), tiny.expected(tiny.keys, 30, 2))

        # The processor's own thread picks up a new version (waiting here is not a speed test).
        tiny.write_full(4, tag=40, w=4)
        deadline = time.monotonic() + 30
        while processor.model_info()["version"] != "4" and time.monotonic() < deadline:
            time.sleep(0.02)
        np.testing.assert_array_equal(_score(processor, tiny.keys), tiny.expected(tiny.keys, 40, 4))
    finally:
        processor.close()


def test_pinned_version_in_the_config(tiny):
    tiny.write_full(1, tag=10, w=1)
    tiny.write_full(2, tag=20, w=2)
    processor = Processor(tiny.config(pinned_version="1"))
    try:
        assert processor.model_info()["pinned_version"] == "1"
        np.testing.assert_array_equal(_score(processor, tiny.keys[:3]), tiny.expected(tiny.keys[:3], 10, 1))
    finally:
        processor.close()


def test_load_version_without_checkpoint_dir_is_a_config_error(tmp_path):
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "plain",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    write_model_dir(tmp_path / "plain", model, ModelSpec())
    processor = Processor({"savedmodel_dir": str(tmp_path / "plain")})
    try:
        with pytest.raises(ConfigError, match="^load_version needs checkpoint_dir"):
            processor.load_version("1")
    finally:
        processor.close()
