"""GPU decisions a SessionGroup makes, run on this machine's CPU-only onnxruntime: one CUDA
stream per session with `use_multi_stream` (each session's provider options name its own),
and TensorRT profiles built from the real graph's input shapes. The sessions are created
with exactly these provider lists; with no CUDA provider they serve on the CPU
(allow_cpu_fallback), and the answers are checked.

Only stream creation is replaced (by a recorder): it needs a GPU. Without one, the real
CudaStreams fails the load with the CUDA runtime's reason, checked last."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.config import parse_config
from recserve.errors import ConfigError, ModelLoadError
from recserve.processor import session_group
from recserve.processor.session_group import SessionGroup

W = np.arange(13 * 2, dtype=np.float32).reshape(13, 2) / 10

pytestmark = pytest.mark.filterwarnings("ignore:Specified provider .* is not in available provider names")


def _model(path: Path, emb_shape: list[Any]) -> str:
    """y = dense @ W + sum(emb over its middle axis)[:, :2]: inputs dense [b, 13], emb `emb_shape`."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["dense", "w"], ["dw"]),
         helper.make_node("ReduceSum", ["emb", "axes"], ["pooled"], keepdims=0),
         helper.make_node("Slice", ["pooled", "starts", "ends", "axes_last"], ["head"]),
         helper.make_node("Add", ["dw", "head"], ["y"])],
        "g",
        [helper.make_tensor_value_info("dense", TensorProto.FLOAT, ["batch", 13]),
         helper.make_tensor_value_info("emb", TensorProto.FLOAT, emb_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.array([1], np.int64), "axes"),
         numpy_helper.from_array(np.array([0], np.int64), "starts"),
         numpy_helper.from_array(np.array([2], np.int64), "ends"),
         numpy_helper.from_array(np.array([1], np.int64), "axes_last")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return str(path)


@pytest.fixture
def model(tmp_path: Path) -> str:
    return _model(tmp_path / "m.onnx", ["batch", 4, 16])


def _config(**fields: Any) -> Any:
    return parse_config({"savedmodel_dir": "/model", "allow_cpu_fallback": True, **fields})


def _feeds(rows: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(rows)
    dense = rng.standard_normal((rows, 13)).astype(np.float32)
    emb = rng.standard_normal((rows, 4, 16)).astype(np.float32)
    return {"dense": dense, "emb": emb}, dense @ W + emb.sum(axis=1)[:, :2]


class RecordedStreams:
    """Stands in for CudaStreams: distinct pointers, and the devices they were made on."""

    made: ClassVar[list[int]] = []
    closed: ClassVar[int] = 0

    def __init__(self) -> None:
        RecordedStreams.made, RecordedStreams.closed = [], 0

    def create(self, device_id: int) -> int:
        RecordedStreams.made.append(device_id)
        return 0x7F00_0000 + 0x100 * len(RecordedStreams.made)

    def close(self) -> None:
        RecordedStreams.closed += 1


@pytest.fixture
def sessions_made(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[str, dict[str, str]]]]:
    """The provider list the group builds for each session it creates (what ONNX Runtime
    gets, through the Python binding or the native runner alike)."""
    made: list[list[tuple[str, dict[str, str]]]] = []
    real = session_group.provider_list

    def recording(*args: Any, **kwargs: Any) -> Any:
        providers = real(*args, **kwargs)
        made.append(list(providers))
        return providers

    monkeypatch.setattr(session_group, "provider_list", recording)
    monkeypatch.setattr(session_group, "CudaStreams", RecordedStreams)
    return made


def test_multi_stream_gives_each_session_its_own_stream_on_its_gpu(model: str, sessions_made: list[Any]) -> None:
    config = _config(execution_provider="cuda", use_multi_stream=True, session_num=2, gpu_ids_list="0,2",
                     use_per_session_threads=True)
    group = SessionGroup(model, config)
    try:
        assert RecordedStreams.made == [0, 0, 2, 2]  # one stream per session, on the session's GPU
        streams = [0x7F00_0000 + 0x100 * n for n in range(1, 5)]
        assert [providers[0] for providers in sessions_made] == [
            ("CUDAExecutionProvider", {"device_id": str(device), "has_user_compute_stream": "1",
                                       "user_compute_stream": str(stream)})
            for device, stream in zip([0, 0, 2, 2], streams)
        ]
        assert all(providers[-1] == ("CPUExecutionProvider", {}) for providers in sessions_made)
        feeds, want = _feeds(3)
        np.testing.assert_allclose(group.run(["y"], feeds)[0], want, rtol=1e-5, atol=1e-5)  # served on the CPU
    finally:
        group.close()
    assert RecordedStreams.closed == 1


@pytest.mark.parametrize("fields", [{"execution_provider": "cuda"},
                                    {"execution_provider": "cpu", "use_multi_stream": True}])
def test_no_streams_without_multi_stream_or_on_the_cpu(model: str, sessions_made: list[Any], fields: dict[str, Any]) -> None:
    group = SessionGroup(model, _config(session_num=2, use_per_session_threads=True, **fields))
    group.close()
    assert RecordedStreams.made == []
    assert all("user_compute_stream" not in options for providers in sessions_made for _, options in providers)


def test_tensorrt_profiles_come_from_the_graphs_inputs(model: str, sessions_made: list[Any]) -> None:
    config = _config(execution_provider="tensorrt", max_batch_size=8, trt_fp16_enable=True)
    group = SessionGroup(model, config)
    try:
        (providers,) = sessions_made
        assert [name for name, _ in providers] == [
            "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
        trt = providers[0][1]
        assert (trt["trt_profile_min_shapes"], trt["trt_profile_opt_shapes"], trt["trt_profile_max_shapes"]) == (
            "dense:1x13,emb:1x4x16", "dense:8x13,emb:8x4x16", "dense:8x13,emb:8x4x16")
        assert trt["trt_fp16_enable"] == "1" and trt["device_id"] == "0"
        feeds, want = _feeds(2)
        np.testing.assert_allclose(group.run(["y"], feeds)[0], want, rtol=1e-5, atol=1e-5)
    finally:
        group.close()


def test_tensorrt_refuses_a_graph_input_with_a_free_inner_dimension(tmp_path: Path, sessions_made: list[Any]) -> None:
    model = _model(tmp_path / "free.onnx", ["batch", "bag", 16])
    with pytest.raises(ConfigError, match=r"graph input 'emb' has shape \['\?', '\?', 16\]"):
        SessionGroup(model, _config(execution_provider="tensorrt", max_batch_size=8))
    assert sessions_made == []


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="needs a machine without CUDA")
def test_multi_stream_without_a_gpu_fails_the_load_with_the_cuda_runtimes_reason(model: str) -> None:
    with pytest.raises(ModelLoadError, match=r"use_multi_stream needs the CUDA runtime library|CUDA cudaSetDevice\(0\) failed"):
        SessionGroup(model, _config(execution_provider="cuda", use_multi_stream=True))
