"""Provider lists and options per config, and the check that ONNX Runtime used them.

No GPU here: the option dictionaries are what is checked; `check_providers` is checked
on real CPU-only sessions, where asking for CUDA silently gives the CPU."""

from __future__ import annotations

import logging
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from recserve.errors import ConfigError, ModelLoadError
from recserve.runtime.providers import (
    DeviceSettings,
    check_providers,
    provider_list,
    tensorrt_profiles,
)

INPUTS = [("dense", (None, 13)), ("emb", (None, 4, 16))]


def test_cpu_is_the_cpu_provider_alone() -> None:
    assert provider_list(DeviceSettings()) == [("CPUExecutionProvider", {})]


def test_cuda_names_the_device_and_keeps_the_cpu_for_unsupported_nodes() -> None:
    assert provider_list(DeviceSettings(provider="cuda", device_id=2)) == [
        ("CUDAExecutionProvider", {"device_id": "2"}),
        ("CPUExecutionProvider", {}),
    ]


def test_a_session_stream_is_passed_as_the_user_compute_stream() -> None:
    providers = provider_list(DeviceSettings(provider="cuda", device_id=1, stream=140234567))
    assert providers[0] == (
        "CUDAExecutionProvider",
        {"device_id": "1", "has_user_compute_stream": "1", "user_compute_stream": "140234567"},
    )


def test_tensorrt_gets_fp16_cache_and_profiles_then_cuda_then_cpu() -> None:
    device = DeviceSettings(
        provider="tensorrt", device_id=0, trt_fp16=True, trt_engine_cache_path="/var/cache/trt", max_batch_size=64
    )
    providers = provider_list(device, INPUTS)
    assert [name for name, _ in providers] == [
        "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider",
    ]
    assert providers[0][1] == {
        "device_id": "0",
        "trt_fp16_enable": "1",
        "trt_engine_cache_enable": "1",
        "trt_engine_cache_path": "/var/cache/trt",
        "trt_profile_min_shapes": "dense:1x13,emb:1x4x16",
        "trt_profile_opt_shapes": "dense:64x13,emb:64x4x16",
        "trt_profile_max_shapes": "dense:64x13,emb:64x4x16",
    }


def test_tensorrt_without_cache_or_fp16() -> None:
    options = provider_list(DeviceSettings(provider="tensorrt", max_batch_size=8), [("ids", (None,))])[0][1]
    assert options["trt_fp16_enable"] == "0" and "trt_engine_cache_enable" not in options
    assert options["trt_profile_max_shapes"] == "ids:8"


def test_tensorrt_needs_max_batch_size_and_fixed_inner_dimensions() -> None:
    with pytest.raises(ConfigError, match="set max_batch_size >= 1"):
        tensorrt_profiles(INPUTS, 0)
    with pytest.raises(ConfigError) as caught:
        tensorrt_profiles([("ids", (None, None))], 8)
    assert caught.value.message == (
        "the TensorRT provider needs every dimension but the first (batch) fixed; graph input 'ids' has shape ['?', '?']"
    )


@pytest.fixture()
def cpu_session_asked_for_cuda(tmp_path: Path) -> ort.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    return ort.InferenceSession(str(path), options, providers=provider_list(DeviceSettings(provider="cuda")))


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="needs a CPU-only onnxruntime")
def test_a_silent_cpu_fallback_fails_the_load_with_the_reason(cpu_session_asked_for_cuda: ort.InferenceSession) -> None:
    wanted = provider_list(DeviceSettings(provider="cuda"))
    with pytest.raises(ModelLoadError) as caught:
        check_providers(cpu_session_asked_for_cuda, wanted, allow_cpu_fallback=False, where="session 0 of m.onnx")
    assert caught.value.message == (
        "session 0 of m.onnx: asked for CUDAExecutionProvider, onnxruntime created the session with "
        f"['CPUExecutionProvider']: this onnxruntime build ({ort.__version__}) has no CUDAExecutionProvider; "
        f"its providers are {ort.get_available_providers()} (install onnxruntime-gpu for CUDA and TensorRT); "
        "set allow_cpu_fallback to true to serve on the CPU instead"
    )


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="needs a CPU-only onnxruntime")
def test_the_fallback_is_a_warning_when_allowed(
    cpu_session_asked_for_cuda: ort.InferenceSession, caplog: pytest.LogCaptureFixture
) -> None:
    wanted = provider_list(DeviceSettings(provider="cuda"))
    with caplog.at_level(logging.WARNING, logger="recserve.runtime"):
        check_providers(cpu_session_asked_for_cuda, wanted, allow_cpu_fallback=True, where="session 0")
    assert "serving on ['CPUExecutionProvider'] because allow_cpu_fallback is true" in caplog.text


def test_the_provider_asked_for_passes() -> None:
    class Session:
        def get_providers(self) -> list[str]:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]

    check_providers(Session(), provider_list(DeviceSettings(provider="cuda")), allow_cpu_fallback=False, where="s")
