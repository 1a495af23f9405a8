"""The C API runner (native/ort_runner.c through recserve.runtime.native_runner) against the
installed onnxruntime: its OrtApi declarations, exact parity with
`onnxruntime.InferenceSession.run`, errors, the session policies and the seam pointer,
concurrent callers, and weights shared across sessions."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from recserve.errors import ModelLoadError, RequestError
from recserve.runtime import native_runner
from recserve.runtime.native_runner import NativeRunner
from recserve.runtime.session_options import ThreadSettings, build_session_options, session_option_values

ROOT = Path(__file__).resolve().parents[2]
W = (np.arange(16 * 300, dtype=np.float32).reshape(16, 300) % 13) / 13 - 0.5
ONE_THREAD = session_option_values(ThreadSettings(intra=1))
CPU = [("CPUExecutionProvider", {})]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Five input dtypes, five outputs, one large initializer."""
    nodes = [
        helper.make_node("MatMul", ["f", "w"], ["fw"]),
        helper.make_node("Relu", ["fw"], ["f_out"]),
        helper.make_node("Mul", ["i64", "three"], ["i64_out"]),
        helper.make_node("Add", ["i32", "i32"], ["i32_out"]),
        helper.make_node("Abs", ["d"], ["d_abs"]),
        helper.make_node("Sqrt", ["d_abs"], ["d_out"]),
        helper.make_node("Not", ["flag"], ["b_out"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("f", TensorProto.FLOAT, ["batch", 16]),
            helper.make_tensor_value_info("i64", TensorProto.INT64, ["batch", 3]),
            helper.make_tensor_value_info("i32", TensorProto.INT32, ["batch", 2]),
            helper.make_tensor_value_info("d", TensorProto.DOUBLE, ["batch", 2]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, ["batch", 1]),
        ],
        [
            helper.make_tensor_value_info("f_out", TensorProto.FLOAT, ["batch", 300]),
            helper.make_tensor_value_info("i64_out", TensorProto.INT64, ["batch", 3]),
            helper.make_tensor_value_info("i32_out", TensorProto.INT32, ["batch", 2]),
            helper.make_tensor_value_info("d_out", TensorProto.DOUBLE, ["batch", 2]),
            helper.make_tensor_value_info("b_out", TensorProto.BOOL, ["batch", 1]),
        ],
        [numpy_helper.from_array(W, "w"), numpy_helper.from_array(np.array(3, np.int64), "three")],
    )
    path = tmp_path_factory.mktemp("native") / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return str(path)


OUTPUTS = ["f_out", "i64_out", "i32_out", "d_out", "b_out"]


def _feeds(rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "f": rng.standard_normal((rows, 16)).astype(np.float32),
        "i64": rng.integers(-(2**40), 2**40, (rows, 3)),
        "i32": rng.integers(-(2**20), 2**20, (rows, 2), dtype=np.int32),
        "d": rng.standard_normal((rows, 2)),
        "flag": rng.integers(0, 2, (rows, 1)).astype(bool),
    }


def _runner(model: str, sessions: int = 1, policy: str = "RR") -> NativeRunner:
    native_runner.use_env()
    runner = NativeRunner(policy=policy, initializers={"w": W})
    for _ in range(sessions):
        runner.add_session(model, ONE_THREAD, CPU)
    return runner


def _reference(model: str) -> ort.InferenceSession:
    """The Python binding's session with the same options (one thread, no prepacking)."""
    return ort.InferenceSession(model, build_session_options(ThreadSettings(intra=1)), providers=["CPUExecutionProvider"])


def test_the_declared_api_is_the_installed_librarys() -> None:
    version = native_runner.use_env()
    assert version == ort.__version__
    assert native_runner.api_version() == 11
    # GetAvailableProviders/ReleaseAvailableProviders sit at slots 125/126: a table off by
    # one would call a neighbour (AddFreeDimensionOverrideByName, GetStringTensorElementLength).
    assert native_runner.available_providers() == ort.get_available_providers()


def test_graph_io_reads_back_through_the_declared_getters(model: str) -> None:
    runner = _runner(model)
    python = _reference(model)
    for native, ours in ((python.get_inputs(), runner.get_inputs()), (python.get_outputs(), runner.get_outputs())):
        assert [(a.name, a.type) for a in native] == [(a.name, a.type) for a in ours]
        assert [[d if isinstance(d, int) else None for d in a.shape] for a in native] == [a.shape for a in ours]
    runner.close()


@pytest.mark.parametrize("rows", [1, 64, 512])
def test_runs_equal_onnxruntimes_python_run_exactly(model: str, rows: int) -> None:
    runner = _runner(model)
    feeds = _feeds(rows, rows)
    got = runner.run(feeds, OUTPUTS)
    want = _reference(model).run(OUTPUTS, feeds)
    for name, g, w in zip(OUTPUTS, got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and np.array_equal(g, w), name
    # a subset, in another order, on a named session
    got = runner.run_on(0, feeds, ["b_out", "f_out"])
    assert np.array_equal(got[0], want[4]) and np.array_equal(got[1], want[0])
    runner.close()


def test_non_contiguous_feeds_are_made_contiguous(model: str) -> None:
    runner = _runner(model)
    feeds = _feeds(8)
    feeds["f"] = np.asfortranarray(feeds["f"])
    feeds["d"] = np.concatenate([feeds["d"], feeds["d"]], axis=1)[:, ::2]
    want = _reference(model).run(OUTPUTS, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
    assert all(np.array_equal(g, w) for g, w in zip(runner.run(feeds, OUTPUTS), want))
    runner.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"f": np.ones((2, 5), np.float32)}, r"Got invalid dimensions for input: f .*index: 1 Got: 5 Expected: 16"),
        ({"f": np.ones((2, 16), np.float64)}, r"Unexpected input data type.*\(tensor\(double\)\).*\(tensor\(float\)\)"),
        ({"nope": np.ones((2, 16), np.float32)}, r"Invalid input name: nope"),
        ({"f": np.array([["a"] * 16] * 2)}, r"input 'f' has dtype <U1; the native runner feeds"),
    ],
)
def test_bad_inputs_are_request_errors_with_onnxruntimes_message(model: str, change: dict, message: str) -> None:
    runner = _runner(model)
    feeds = {**_feeds(2), **change}
    with pytest.raises(RequestError, match="(?s)the model rejected the inputs: " + message):
        runner.run(feeds, OUTPUTS)
    with pytest.raises(RequestError, match="Invalid output name: nope"):
        runner.run(_feeds(2), ["f_out", "nope"])
    # the runner is unharmed
    assert np.array_equal(runner.run(_feeds(2), ["i32_out"])[0], _feeds(2)["i32"] * 2)
    runner.close()


def test_a_model_onnxruntime_cannot_load_is_a_load_error(tmp_path: Path) -> None:
    native_runner.use_env()
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    runner = NativeRunner(policy="RR", initializers={})
    with pytest.raises(ModelLoadError, match=f"onnxruntime cannot load {broken}: .*[Pp]rotobuf"):
        runner.add_session(str(broken), ONE_THREAD, CPU, where=str(broken))
    assert runner.session_count == 0
    runner.close()


def test_asking_for_gpu_providers_on_this_build_records_onnxruntimes_refusal(model: str) -> None:
    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("needs a CPU-only onnxruntime")
    native_runner.use_env()
    runner = NativeRunner(policy="RR", initializers={"w": W})
    cuda = {"device_id": "0", "has_user_compute_stream": "1", "user_compute_stream": "12345"}
    runner.add_session(model, ONE_THREAD, [("TensorrtExecutionProvider", {**cuda, "trt_fp16_enable": "1"}),
                                           ("CUDAExecutionProvider", cuda), ("CPUExecutionProvider", {})])
    names, refused = runner.providers(0)
    assert names == ["CPUExecutionProvider"]
    assert refused.splitlines() == [
        "TensorrtExecutionProvider: TensorRT execution provider is not enabled in this build.",
        "CUDAExecutionProvider: CUDA execution provider is not enabled in this build.",
    ]
    feeds = _feeds(3)
    assert np.array_equal(runner.run(feeds, ["f_out"])[0], _reference(model).run(["f_out"], feeds)[0])
    runner.close()


def test_policies_pick_sessions_as_session_policy_does(model: str) -> None:
    rr = _runner(model, sessions=3, policy="RR")
    assert [native_runner._lib.rs_ort_pick_session(rr.handle) for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    mod = _runner(model, sessions=2, policy="MOD")
    picks: dict[str, list[int]] = {}

    def caller(name: str) -> None:
        picks[name] = [native_runner._lib.rs_ort_pick_session(mod.handle) for _ in range(3)]

    for name in ("first", "second", "third"):  # one after another: numbered 0, 1, 2 in order of arrival
        thread = threading.Thread(target=caller, args=(name,))
        thread.start()
        thread.join(timeout=30)
        assert not thread.is_alive()
    assert picks == {"first": [0, 0, 0], "second": [1, 1, 1], "third": [0, 0, 0]}
    busy = _runner(model, sessions=2, policy="LEAST_BUSY")
    assert {native_runner._lib.rs_ort_pick_session(busy.handle) for _ in range(4)} == {0, 1}
    for runner in (rr, mod, busy):
        runner.close()


def test_the_seam_pointer_runs_the_graph(model: str) -> None:
    """What native callers do: call rs_dense_run_fn at dense_run_address with the handle."""
    from recserve.runtime.native_runner import _err, _i64p, _TensorIn, _TensorOut

    runner = _runner(model, sessions=2)
    seam = ctypes.CFUNCTYPE(
        ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(_TensorIn), ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t, ctypes.POINTER(_TensorOut), _err,
    )(runner.dense_run_address)
    feeds = _feeds(3)
    codes = {"f": 1, "i64": 7, "i32": 6, "d": 11, "flag": 9}
    shapes = {name: (ctypes.c_int64 * 2)(*a.shape) for name, a in feeds.items()}

    def tensors(names: list[str], types: dict[str, int]) -> ctypes.Array:
        return (_TensorIn * len(names))(*[
            _TensorIn(n.encode(), types[n], ctypes.cast(shapes[n], _i64p), 2, feeds[n].ctypes.data) for n in names
        ])

    outs = (_TensorOut * 1)()
    err = ctypes.c_char_p()
    names = (ctypes.c_char_p * 1)(b"i32_out")
    assert seam(runner.handle, tensors(list(feeds), codes), 5, names, 1, outs, ctypes.byref(err)) == 0
    out = outs[0]
    assert (out.elem_type, list(out.shape[: out.rank]), out.bytes) == (6, [3, 2], 24)
    got = np.ctypeslib.as_array(ctypes.cast(out.data, ctypes.POINTER(ctypes.c_int32)), (3, 2))
    assert np.array_equal(got, feeds["i32"] * 2)
    native_runner._lib.rs_ort_free_outputs(outs, 1)

    def fails(inputs: ctypes.Array, count: int) -> tuple[int, str]:
        outs[0] = _TensorOut()
        status = seam(runner.handle, inputs, count, names, 1, outs, ctypes.byref(err))
        assert outs[0].data is None  # nothing left allocated on failure
        message = (err.value or b"").decode()
        native_runner._lib.rs_ort_free_error(ctypes.cast(err, ctypes.c_void_p))
        return status, message

    status, message = fails(tensors(list(feeds), {**codes, "i64": 6}), 5)
    assert status == 400 and "Unexpected input data type" in message
    assert fails(tensors(["i32", "f"], codes), 2) == (400, "missing graph input(s): i64, d, flag")
    runner.close()


@pytest.mark.parametrize("policy", ["RR", "MOD", "LEAST_BUSY"])
def test_four_threads_get_exact_results(model: str, policy: str) -> None:
    runner = _runner(model, sessions=2, policy=policy)
    reference = _reference(model)
    cases = [_feeds(1 + 37 * (k % 4), k) for k in range(8)]
    wants = [reference.run(OUTPUTS, feeds) for feeds in cases]
    failures: list[str] = []

    def caller(seed: int) -> None:
        try:
            for k in range(40):
                case = (seed + k) % len(cases)
                got = runner.run(cases[case], OUTPUTS)
                if not all(np.array_equal(g, w) for g, w in zip(got, wants[case])):
                    failures.append(f"thread {seed} run {k}: wrong result")
        except Exception as exc:  # noqa: BLE001 -- any exception fails the test below
            failures.append(f"thread {seed}: {exc!r}")

    threads = [threading.Thread(target=caller, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads) and failures == []
    runner.close()


def test_an_older_library_is_refused_with_the_version_it_has(tmp_path: Path) -> None:
    """A library whose GetApi does not know version 11, as ONNX Runtime < 1.11 answers."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("needs a C compiler")
    source = tmp_path / "old_ort.c"
    source.write_text(textwrap.dedent("""
        #include <stddef.h>
        #include <stdint.h>
        static const void *get_api(uint32_t version) { return version <= 10 ? (const void *)1 : NULL; }
        static const char *version_string(void) { return "1.10.0"; }
        static const struct { const void *(*get)(uint32_t); const char *(*version)(void); } base = {get_api, version_string};
        const void *OrtGetApiBase(void) { return &base; }
    """))
    library = tmp_path / "libold_ort.so"
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(library)], check=True, timeout=120)
    child = textwrap.dedent(f"""
        import ctypes, json
        lib = ctypes.CDLL({str(ROOT / "recserve/runtime/librecserve_ort.so")!r})
        err = ctypes.c_char_p()
        status = lib.rs_ort_env({str(library)!r}.encode(), 0, 0, 0, 0, ctypes.byref(err))
        print(json.dumps([status, err.value.decode()]))
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True, timeout=120)
    status, message = json.loads(out.stdout)
    assert status == 500 and message == (
        f"ONNX Runtime 1.10.0 at {library} does not offer C API version 11, which recserve's native runner "
        "needs (ONNX Runtime >= 1.11)"
    )


MEMORY_CHILD = textwrap.dedent("""
    import json, os, sys
    import numpy as np, onnx, onnxruntime as ort
    from recserve.config import parse_config
    from recserve.processor.session_group import SessionGroup

    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    path, how, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    x = np.ones((4, 2048), np.float32)
    before = rss()
    if how == "plain":  # the Python binding, each session with its own copy
        held = [ort.InferenceSession(path, providers=["CPUExecutionProvider"]) for _ in range(count)]
        for s in held:
            s.run(["y"], {"x": x})
    else:  # a SessionGroup: native (RECSERVE_NATIVE_DENSE unset) or Python sessions
        held = SessionGroup(path, parse_config({"savedmodel_dir": "/m", "session_num": count,
                                                "use_per_session_threads": True, "prepack_weights": False}))
        for i in range(count):
            held.run(["y"], {"x": x}, session=i)
        assert (held.native_runner is not None) == (os.environ.get("RECSERVE_NATIVE_DENSE") != "0")
    print(json.dumps(rss() - before))
""")


def test_sessions_share_weights_so_memory_does_not_grow_with_session_num(tmp_path: Path) -> None:
    """A 64 MiB initializer: N C API sessions cost about what one does, as N Python
    sessions sharing the buffer do, where N plain sessions cost N copies."""
    weight = np.random.default_rng(0).standard_normal((2048, 8192)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 2048])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 8192])],
        [numpy_helper.from_array(weight, "w")],
    )
    path = tmp_path / "big.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    mib = 2**20

    def grown(how: str, count: int, native: bool = True) -> float:
        env = {**os.environ, "RECSERVE_NATIVE_DENSE": "1" if native else "0"}
        out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(path), how, str(count)], capture_output=True,
                             text=True, check=True, cwd=ROOT, env=env, timeout=300)
        return json.loads(out.stdout.splitlines()[-1]) / mib

    native_1, native_4 = grown("group", 1), grown("group", 4)
    python_1, python_4 = grown("group", 1, native=False), grown("group", 4, native=False)
    plain_1, plain_4 = grown("plain", 1), grown("plain", 4)
    report = f"MiB grown: native {native_1:.0f}->{native_4:.0f}, python {python_1:.0f}->{python_4:.0f}, plain {plain_1:.0f}->{plain_4:.0f}"
    print(report)
    assert plain_4 - plain_1 > 2 * 64, report  # the measure sees copies
    assert native_4 - native_1 < 0.25 * 64, report
    assert native_4 < python_4 + 32, report  # not more than the Python sessions that share the same way


def test_a_run_releases_the_gil(tmp_path: Path) -> None:
    """With a switch interval so long that Python never hands the GIL over by itself, the
    main thread can run while the worker's run is in progress (the session's in-flight
    count is 1) only if the worker released the GIL for the run."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", 1024])],
        [numpy_helper.from_array(np.ones((1024, 1024), np.float32), "w")],
    )
    path = tmp_path / "slow.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    native_runner.use_env()
    runner = NativeRunner(policy="RR", initializers={})
    runner.add_session(str(path), ONE_THREAD, CPU)
    x = {"x": np.ones((512, 1024), np.float32)}
    done = threading.Event()

    def worker() -> None:
        for _ in range(3):
            runner.run(x, ["y"])
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(100.0)
    try:
        thread = threading.Thread(target=worker)
        thread.start()
        seen_running = False
        while not done.is_set() and not seen_running:
            seen_running = runner.in_flight(0) == 1
        thread.join(timeout=120)  # blocking: hands the GIL back whatever happened
    finally:
        sys.setswitchinterval(interval)
    assert not thread.is_alive() and done.is_set()
    assert seen_running
    assert runner.in_flight(0) == 0
    runner.close()
