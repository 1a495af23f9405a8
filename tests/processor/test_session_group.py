"""SessionGroup on real ONNX Runtime sessions: shared weights, policies, cpusets,
providers and dynamic batching. Every group with several sessions uses its own pools
(use_per_session_threads true): global pools would bind the whole test process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.config import parse_config
from recserve.errors import ConfigError, ModelLoadError, RequestError
from recserve.processor import session_group
from recserve.processor.session_group import SessionGroup, device_settings
from recserve.runtime.cpus import available_cpus
from tests.threads import Threads

W = (np.arange(64 * 300, dtype=np.float32).reshape(64, 300) % 17) / 17
BIAS = np.linspace(-1, 1, 300, dtype=np.float32)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "bias"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 300])],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(BIAS, "bias")],
    )
    path = tmp_path_factory.mktemp("group") / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return str(path)


def _config(**fields: Any) -> Any:
    if fields.get("session_num", 1) > 1:
        fields.setdefault("use_per_session_threads", True)
    return parse_config({"savedmodel_dir": "/model", **fields})


def _x(rows: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, 64)).astype(np.float32)


def test_large_weights_are_shared_and_overrides_replace_them(model: str) -> None:
    override = np.ones((64, 300), np.float32)
    group = SessionGroup(model, _config(session_num=3, select_session_policy="RR"), dense_overrides={"w": override})
    assert group.session_count == 3 and group.shared_weight_names == ["w"]
    x = _x(2)
    for _ in range(3):  # RR: each session in turn
        np.testing.assert_allclose(group.run(["y"], {"x": x})[0], x @ override + BIAS, rtol=1e-4, atol=1e-4)
    assert [t.name for t in group.inputs] == ["x"] and group.outputs[0].shape == (None, 300)
    group.close()


def test_unknown_or_misshapen_overrides_fail_the_load(model: str) -> None:
    with pytest.raises(ModelLoadError, match=r"dense.safetensors has tensors \['nope'\] that are not initializers"):
        SessionGroup(model, _config(), dense_overrides={"nope": np.ones(2, np.float32)})
    with pytest.raises(ModelLoadError, match=r"tensor 'w' has shape \[2\], the graph's initializer has \[64, 300\]"):
        SessionGroup(model, _config(), dense_overrides={"w": np.ones(2, np.float32)})


@pytest.mark.parametrize("policy", ["MOD", "RR", "LEAST_BUSY"])
def test_every_policy_answers_concurrent_callers_correctly(model: str, policy: str) -> None:
    group = SessionGroup(model, _config(session_num=2, select_session_policy=policy))
    used: list[int] = []
    original = group._run_on

    def spy(index: int, names: Any, feeds: Any) -> list[np.ndarray]:
        used.append(index)
        return original(index, names, feeds)

    group._run_on = spy  # type: ignore[method-assign]
    errors: list[str] = []

    def caller(seed: int) -> int:
        for k in range(20):
            x = _x(1 + k % 3, seed * 100 + k)
            if not np.allclose(group.run(["y"], {"x": x})[0], x @ W + BIAS, rtol=1e-4, atol=1e-4):
                errors.append(f"{seed}/{k}")
        return k + 1

    calls = Threads([lambda s=s: caller(s) for s in range(4)], f"{policy} callers").join(timeout=120)
    assert calls == [20] * 4 and len(used) == 80
    assert errors == [] and sorted(set(used)) == [0, 1]
    group.close()


def test_auto_prepacks_small_weights_once_and_shares_otherwise(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def disables_prepacking(group: SessionGroup) -> bool:
        told = group.session_config(0).get("session.disable_prepacking") == "1"
        if group.native_runner is None:  # a Python session can show what ONNX Runtime holds
            options = group._sessions[0].get_session_options()
            try:
                assert (options.get_session_config_entry("session.disable_prepacking") == "1") == told
            except RuntimeError:  # never set: ONNX Runtime prepacks
                assert not told
        return told

    native = os.environ.get("RECSERVE_NATIVE_DENSE") != "0"
    cases = {
        "auto, one session": (_config(), True),
        # The native runner's sessions share one packed copy; the Python binding's cannot.
        "auto, two sessions": (_config(session_num=2), native),
        "true, two sessions": (_config(session_num=2, prepack_weights=True), True),
        "false, one session": (_config(prepack_weights=False), False),
    }
    x = _x(3)
    for name, (config, prepacked) in cases.items():
        group = SessionGroup(model, config)
        assert (group.prepacking, disables_prepacking(group)) == (prepacked, not prepacked), name
        np.testing.assert_allclose(group.run(["y"], {"x": x})[0], x @ W + BIAS, rtol=1e-4, atol=1e-4)
        group.close()
    monkeypatch.setattr(session_group, "PREPACK_AUTO_MAX_BYTES", W.nbytes - 1)  # w is just too big
    group = SessionGroup(model, _config())
    assert (group.prepacking, disables_prepacking(group)) == (False, True)
    group.close()


@pytest.mark.skipif(os.environ.get("RECSERVE_NATIVE_DENSE") == "0", reason="the Python binding has no shared packing")
def test_answers_are_bit_identical_whatever_the_session_count(model: str) -> None:
    """Every session packs its weights the same way (one shared packed copy), so adding
    sessions never changes an answer, not even in the last bit (before, 2 sessions went
    unpacked and answered a few ulps away from 1)."""
    x = _x(1, 7)
    one = SessionGroup(model, _config())
    two = SessionGroup(model, _config(session_num=2, select_session_policy="RR"))
    try:
        want = one.run(["y"], {"x": x})[0]
        got = [two.run(["y"], {"x": x})[0] for _ in range(4)]  # round robin: both sessions
        assert one.prepacking and two.prepacking
        for answer in got:
            np.testing.assert_array_equal(answer, want)
        np.testing.assert_allclose(want, x @ W + BIAS, rtol=1e-4, atol=1e-4)
    finally:
        one.close()
        two.close()


def test_bad_inputs_are_request_errors(model: str) -> None:
    group = SessionGroup(model, _config())
    with pytest.raises(RequestError, match="the model rejected the inputs"):
        group.run(["y"], {"x": np.ones((2, 5), np.float32)})


def test_cpusets_pin_the_calling_thread_to_its_sessions_cpus(model: str) -> None:
    cpus = sorted(available_cpus())
    groups = ";".join(str(c) for c in cpus[:2]) if len(cpus) > 1 else f"{cpus[0]};{cpus[0]}"
    group = SessionGroup(model, _config(session_num=2, cpusets=groups, select_session_policy="RR"))
    seen: list[set[int]] = []

    def caller() -> None:
        import os

        for _ in range(2):
            group.run(["y"], {"x": _x(1)})
            seen.append(set(os.sched_getaffinity(0)))

    Threads([caller], "a caller on pinned sessions").join(timeout=60)
    assert seen == [{int(g)} for g in groups.split(";")]


def test_a_cpuset_naming_a_missing_cpu_is_a_clear_error(model: str) -> None:
    missing = max(available_cpus()) + 1
    with pytest.raises(ConfigError, match=f"cpusets group 1 \\({missing}\\) names CPU\\(s\\) {missing} that this process cannot use"):
        SessionGroup(model, _config(session_num=2, cpusets=f"0;{missing}"))


def test_gpu_sessions_are_spread_over_gpu_ids_list() -> None:
    config = _config(session_num=2, gpu_ids_list="0,2")
    assert config.session_count == 4
    devices = [device_settings(config, i) for i in range(4)]
    assert [(d.provider, d.device_id) for d in devices] == [("cuda", 0), ("cuda", 0), ("cuda", 2), ("cuda", 2)]
    assert device_settings(_config(), 0).provider == "cpu"
    trt = device_settings(_config(execution_provider="tensorrt", trt_fp16_enable=True, max_batch_size=32), 0)
    assert (trt.provider, trt.device_id, trt.trt_fp16, trt.max_batch_size) == ("tensorrt", 0, True, 32)


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="needs a CPU-only onnxruntime")
def test_asking_for_cuda_without_it_fails_loudly_or_falls_back_when_allowed(model: str) -> None:
    with pytest.raises(ModelLoadError, match="session 0 of .*asked for CUDAExecutionProvider, onnxruntime created the session with \\['CPUExecutionProvider'\\]"):
        SessionGroup(model, _config(execution_provider="cuda"))
    group = SessionGroup(model, _config(execution_provider="cuda", allow_cpu_fallback=True))
    assert group.providers(0) == ["CPUExecutionProvider"]
    x = _x(1)
    np.testing.assert_allclose(group.run(["y"], {"x": x})[0], x @ W + BIAS, rtol=1e-4, atol=1e-4)


def test_dynamic_batching_answers_each_caller_with_its_own_rows(model: str) -> None:
    group = SessionGroup(model, _config(session_num=2, max_batch_size=16, batch_timeout_micros=5000))
    errors: list[str] = []

    def caller(seed: int) -> int:
        for k in range(10):
            x = _x(1 + (seed + k) % 4, seed * 1000 + k)
            y = group.run(["y"], {"x": x})[0]
            if y.shape != (x.shape[0], 300) or not np.allclose(y, x @ W + BIAS, rtol=1e-4, atol=1e-4):
                errors.append(f"{seed}/{k}")
        return k + 1

    try:
        calls = Threads([lambda s=s: caller(s) for s in range(12)], "batched callers").join(timeout=120)
    finally:
        group.close()
    assert calls == [10] * 12 and errors == []


def test_dynamic_batching_needs_a_free_batch_dimension(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2])],
    )
    path = tmp_path / "fixed.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    with pytest.raises(ModelLoadError, match="graph input 'x' has shape \\[4, 2\\]; dynamic batching needs a free first"):
        SessionGroup(str(path), _config(max_batch_size=8))
