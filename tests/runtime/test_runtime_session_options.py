"""SessionOptions from thread settings, checked on real ONNX Runtime sessions."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.runtime.cpus import available_cpus
from recserve.runtime.session_options import ThreadSettings, build_session_options


def _model(path: Path) -> str:
    w = np.arange(64 * 32, dtype=np.float32).reshape(64, 32) / 1000
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 32])],
        [numpy_helper.from_array(w, "w")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return str(path)


def _threads() -> dict[int, str]:
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/status") as status:
                out[int(tid)] = next(l.split(":")[1].strip() for l in status if l.startswith("Cpus_allowed_list"))
        except FileNotFoundError:
            pass
    return out


def _new_threads(model: str, options: ort.SessionOptions) -> tuple[ort.InferenceSession, dict[int, str]]:
    before = _threads()
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    return session, {t: cpus for t, cpus in _threads().items() if t not in before}


def _entry(options: ort.SessionOptions, key: str) -> str:
    return options.get_session_config_entry(key)


def test_defaults_turn_spinning_and_prepacking_off() -> None:
    options = build_session_options(ThreadSettings(intra=2, inter=1))
    assert options.intra_op_num_threads == 2 and options.inter_op_num_threads == 1
    assert _entry(options, "session.intra_op.allow_spinning") == "0"
    assert _entry(options, "session.inter_op.allow_spinning") == "0"
    assert _entry(options, "session.disable_prepacking") == "1"
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    spinning = build_session_options(ThreadSettings(spinning=True), prepacking=True)
    assert _entry(spinning, "session.intra_op.allow_spinning") == "1"
    with pytest.raises(RuntimeError, match="does not have configuration with key: session.disable_prepacking"):
        _entry(spinning, "session.disable_prepacking")  # never set: ONNX Runtime prepacks


def test_inter_op_threads_turn_on_the_parallel_executor() -> None:
    options = build_session_options(ThreadSettings(inter=2))
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL


def test_inline_execution_starts_no_thread_and_overrides_pool_sizes(tmp_path: Path) -> None:
    options = build_session_options(ThreadSettings(intra=4, inter=4, inline=True))
    assert (options.intra_op_num_threads, options.inter_op_num_threads) == (1, 1)
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    session, started = _new_threads(_model(tmp_path / "m.onnx"), options)
    assert started == {}
    x = np.ones((2, 64), np.float32)
    np.testing.assert_allclose(session.run(None, {"x": x})[0], x @ (np.arange(64 * 32).reshape(64, 32) / 1000), rtol=1e-5)


def test_a_cpu_group_sizes_the_pool_and_pins_its_workers(tmp_path: Path) -> None:
    assert build_session_options(ThreadSettings(cpus=(0, 1, 2))).intra_op_num_threads == 3
    cpu = min(available_cpus())
    options = build_session_options(ThreadSettings(intra=2, cpus=(cpu,)))
    assert _entry(options, "session.intra_op_thread_affinities") == str(cpu + 1)
    session, started = _new_threads(_model(tmp_path / "m.onnx"), options)
    session.run(None, {"x": np.ones((256, 64), np.float32)})
    # A worker pins itself once it has started: poll (bounded) instead of racing it.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        now = {t: cpus for t, cpus in _threads().items() if t in started}
        if list(now.values()).count(str(cpu)) == 1:
            break
        time.sleep(0.01)
    # One worker, on the group's CPU (ONNX Runtime may start unpinned helper threads too).
    assert list(now.values()).count(str(cpu)) == 1


def test_global_pools_leave_sizes_to_the_process() -> None:
    options = build_session_options(ThreadSettings(intra=3, per_session_threads=False))
    assert options.use_per_session_threads is False
    assert options.intra_op_num_threads == 0
