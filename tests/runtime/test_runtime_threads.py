"""Process-wide thread settings; global pools are tested in a child process because
ONNX Runtime allows only one set per process and then refuses per-session pools."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from recserve.runtime.threads import apply_thread_environment, loaded_openmp_runtimes


def test_thread_environment_is_exported(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("KMP_BLOCKTIME", raising=False)
    apply_thread_environment({"OMP_NUM_THREADS": "2", "KMP_BLOCKTIME": "0"})
    assert (os.environ["OMP_NUM_THREADS"], os.environ["KMP_BLOCKTIME"]) == ("2", "0")


def test_the_pypi_onnxruntime_loads_no_openmp_runtime() -> None:
    import onnxruntime  # noqa: F401

    assert loaded_openmp_runtimes() == []


CHILD = textwrap.dedent(
    """
    import logging, sys
    import numpy as np, onnx
    from onnx import TensorProto, helper
    from recserve.errors import ConfigError
    from recserve.config import parse_config
    from recserve.processor.session_group import SessionGroup
    from recserve.runtime.threads import global_thread_pools
    logging.basicConfig(level=logging.WARNING, stream=sys.stdout, format="%(message)s")
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), sys.argv[1])
    def group(**fields):
        return SessionGroup(sys.argv[1], parse_config({"savedmodel_dir": "/m", **fields}))
    group(session_num=2)
    print("use_per_session_threads false alone keeps own pools:", global_thread_pools())
    two = group(session_num=2, ort_global_thread_pools=True, intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
    print("opted in:", global_thread_pools(), two.run(["y"], {"x": np.array([[-1, 2]], np.float32)})[0].tolist())
    group(session_num=2, ort_global_thread_pools=True, intra_op_parallelism_threads=2)
    try:
        group(session_num=1)
    except ConfigError as exc:
        print("error:", exc.field)
    """
)


def test_global_pools_are_made_once_and_then_refuse_own_pools(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "m.onnx")], capture_output=True, text=True, check=True,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert out.stdout.splitlines() == [
        "use_per_session_threads false alone keeps own pools: None",
        "opted in: (1, 1) [[0.0, 2.0]]",
        (
            "ONNX Runtime's global thread pools exist with intra=1 inter=1 (set by the first model); "
            "this model asked for intra=2 inter=0 and shares the existing pools"
        ),
        "error: ort_global_thread_pools",
    ]
