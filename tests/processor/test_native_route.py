"""The native request route (native/route.c, recserve.processor.native_route): once a layout
has a route, `Processor.process` answers it in C. Its bytes must be the Python route's, for
every request shape the route tests use; requests it does not serve are counted by reason;
a swap never frees a version a native request still holds."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from recserve import Processor
from recserve.export.demo import DemoModel
from recserve.model_store.checkpoint import Checkpoint
from recserve.model_store.manifest import Manifest
from recserve.model_store.versions import VersionRef
from recserve.processor import native_route
from recserve.processor.trace import RequestTrace
from recserve.wire import codec
from recserve.wire.codec import encode_request
from tests.processor.test_processor_parity import _random_model, _random_request
from tests.threads import Threads

pytestmark = pytest.mark.skipif(codec._native is None, reason="routes need the native parser (RECSERVE_PURE_PYTHON=1)")

WAIT = 30.0  # seconds: every wait below has this bound


def _python_route(processor: Processor, data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[int, bytes]:
    """The spec: the general Python path (generated parser, signature checks, predict)."""
    with monkeypatch.context() as m:
        m.setattr(codec, "_native_parse", None)
        return processor.process_python(data)


def _served(processor: Processor) -> int:
    return int(processor.model_info()["native_route"]["served"])


def _serve_while_versions_swap(processor: Processor, requests: list[bytes],
                               answers: dict[str, list[tuple[int, bytes]]], callers: str) -> None:
    """Three threads serve `requests` while versions "1" and "2" swap six times: each answer
    is one of the two versions' (`answers[version][j]` for request j), never a mix or a
    crash, and the native route served some of them."""
    stop = threading.Event()

    def hammer(k: int) -> int:
        served, i = 0, k
        while not stop.is_set():
            j = i % len(requests)
            got = processor.process(requests[j])
            assert got in (answers["1"][j], answers["2"][j]), got[1][:200]
            served += 1
            i += 1
        return served

    before = _served(processor)
    workers = Threads([lambda k=k: hammer(k) for k in range(3)], callers)
    try:
        for swap in range(6):
            processor.load_version("1" if swap % 2 else "2")
            stop.wait(0.1)
            workers.check()
    finally:
        stop.set()
    assert sum(workers.join(WAIT)) > 0 and _served(processor) > before


def _assert_native_equals_python(processor: Processor, data: bytes, monkeypatch: pytest.MonkeyPatch,
                                 native: bool = True) -> None:
    want = _python_route(processor, data, monkeypatch)
    assert want[0] == 200, want[1][:300]
    processor.process(data)                  # a new layout: validated and registered by Python
    before = _served(processor)
    got = processor.process(data)
    assert got == want
    assert _served(processor) == before + (1 if native else 0)


def test_the_demo_model_is_served_natively_byte_for_byte(
    processor: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert processor.model_info()["native_route"]["enabled"]
    rng = np.random.default_rng(21)
    for batch in (1, 2, 3, 8, 64):
        _assert_native_equals_python(processor, encode_request(demo.sample_inputs(batch, rng)), monkeypatch)
    inputs = demo.sample_inputs(2, rng)
    renamed = {("user_id:0" if k == "user_id" else k): v for k, v in inputs.items()}
    for request, output_filter in ((inputs, ["prob"]), (renamed, ["logits", "prob"]), (inputs, [])):
        _assert_native_equals_python(processor, encode_request(request, output_filter=output_filter), monkeypatch)


def test_narrow_integers_and_strings_are_native_and_halves_stay_in_python(
    processor: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = demo.sample_inputs(3, np.random.default_rng(8))
    inputs["user_id"] = np.array([-5, 7, 2**31 - 1], np.int32)
    inputs["item_id"] = inputs["item_id"].astype(np.uint16)
    inputs["age"] = np.array([[18], [40], [-3]], np.int16)   # int16 on the wire, float32 to the graph
    inputs["city"] = np.array([b"Hangzhou", "東京".encode(), b""], dtype=object)
    _assert_native_equals_python(processor, encode_request(inputs), monkeypatch)
    # float16 values have no native reader: the layout is served by Python every time, its
    # first request counted as a route miss, every later one as not native.
    inputs["price"] = inputs["price"].astype(np.float16)
    before = processor.model_info()["native_route"]["fallbacks"]
    _assert_native_equals_python(processor, encode_request(inputs), monkeypatch, native=False)
    assert processor.process(encode_request(inputs))[0] == 200
    after = processor.model_info()["native_route"]["fallbacks"]
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {"route_miss": 1, "not_native": 2}


def test_every_binding_shape_and_combiner_is_native(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir, checkpoint_dir, known = _random_model(tmp_path)
    processor = Processor({"savedmodel_dir": str(model_dir), "checkpoint_dir": str(checkpoint_dir)})
    try:
        rng = np.random.default_rng(17)
        for _ in range(60):
            _assert_native_equals_python(processor, encode_request(_random_request(rng, known)), monkeypatch)
    finally:
        processor.close()


def test_the_plain_dlrm_model_with_its_folded_concat_is_native(
    plain_processor: Processor, plain, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert isinstance(plain_processor._manager.current.native._runner, native_route.OrtRunner)
    rng = np.random.default_rng(3)
    for batch in (1, 2, 64, 512):
        _assert_native_equals_python(plain_processor, encode_request(plain.sample(batch, rng)), monkeypatch)


def test_fallbacks_are_counted_by_reason(
    processor: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = encode_request(demo.sample_inputs(5, np.random.default_rng(30)))

    def fallbacks() -> dict[str, int]:
        return processor.model_info()["native_route"]["fallbacks"]

    before = fallbacks()
    assert processor.process(data)[0] == 200          # a new layout
    assert processor.process(b"\x0a\xff")[0] == 400  # bytes the C parser declines
    traced = RequestTrace(want_ort_profile=True)
    assert processor.process(data, trace=traced)[0] == 200
    assert traced.ort_profile_path is not None
    after = fallbacks()
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == {
        "route_miss": 1, "parse": 1, "trace": 1}


def _new_version(processor: Processor):
    return processor._build(Checkpoint(VersionRef("graph", processor.config.savedmodel_dir, 0),
                                       Manifest("full", 0, {}), {}, {}))


@pytest.fixture
def python_run_processor(plain, monkeypatch: pytest.MonkeyPatch) -> Iterator[Processor]:
    """The plain model with Python sessions: its native route's dense run calls back into
    Python (PythonRunner), where a test can hold a request in the middle of its lease."""
    monkeypatch.setenv("RECSERVE_NATIVE_DENSE", "0")
    p = Processor(plain.config())
    yield p
    p.close()


def test_a_swap_frees_the_old_version_only_after_its_native_requests_end(
    python_run_processor: Processor, plain, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain_processor = python_run_processor
    data = encode_request(plain.sample(4, np.random.default_rng(40)))
    want = _python_route(plain_processor, data, monkeypatch)
    plain_processor.process(data)
    old = plain_processor._manager.current
    assert isinstance(old.native._runner, native_route.PythonRunner)
    entered, release = threading.Event(), threading.Event()
    run = old.sessions.run

    def held_run(*args, **kwargs):
        entered.set()
        assert release.wait(WAIT)
        return run(*args, **kwargs)

    monkeypatch.setattr(old.sessions, "run", held_run)
    result: list[tuple[int, bytes]] = []
    errors: list[BaseException] = []

    def request() -> None:
        try:
            result.append(plain_processor.process(data))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=request)
    thread.start()
    try:
        assert entered.wait(WAIT)
        native = old.native
        assert native is not None and native.address is not None
        plain_processor._manager.swap(_new_version(plain_processor))  # retires `old`: its lease is native only
        # The closer waits for the native lease: the version and its sessions are still there.
        assert not release.wait(0.3)
        assert native.address is not None and old.sessions.session_count > 0
    finally:
        release.set()
        thread.join(WAIT)
    assert not thread.is_alive() and not errors
    assert result == [want]
    for _ in range(int(WAIT / 0.05)):
        if native.address is None:
            break
        threading.Event().wait(0.05)
    assert native.address is None  # freed once the request ended
    assert plain_processor.process(data) == want  # the new version serves (its first request: Python)


def test_threads_serve_natively_while_versions_swap(
    plain_processor: Processor, plain, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(50)
    requests = [encode_request(plain.sample(b, rng)) for b in (1, 1, 2, 8)]
    expected = [_python_route(plain_processor, r, monkeypatch) for r in requests]
    stop = threading.Event()

    def hammer(k: int) -> int:
        served, i = 0, k
        while not stop.is_set():
            got = plain_processor.process(requests[i % len(requests)])
            assert got == expected[i % len(requests)]
            served += 1
            i += 1
        return served

    before = _served(plain_processor)
    workers = Threads([lambda k=k: hammer(k) for k in range(4)], "native route callers")
    try:
        for _ in range(8):
            plain_processor._manager.swap(_new_version(plain_processor))
            stop.wait(0.2)
            workers.check()
    finally:
        stop.set()
    assert sum(workers.join(WAIT)) > 0
    assert _served(plain_processor) > before


def test_bytes_like_requests_are_served_natively(
    processor: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = encode_request(demo.sample_inputs(6, np.random.default_rng(60)))
    want = _python_route(processor, data, monkeypatch)
    processor.process(data)
    before = _served(processor)
    assert processor.process(bytearray(data)) == want   # the HTTP server's bodies
    assert processor.process(memoryview(data)) == want
    assert _served(processor) == before + 2


def test_default_rows_are_served_natively_like_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `{"rows": file}` default (DeepRec's EV): unknown ids answer D[id mod k] through the
    native route, byte for byte the Python route's, and equal to numpy indexing of the .npy
    file (the graph only concatenates the embeddings)."""
    from onnx import TensorProto, helper

    from recserve.export import write_checkpoint, write_model_dir
    from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec, SignatureSpec

    rng = np.random.default_rng(5)
    matrix = rng.standard_normal((3, 4)).astype(np.float32)
    default = DefaultSpec(kind="rows", rows_file="defaults/items.npy", matrix=matrix)
    bindings = (EmbeddingBinding("item", "items", 4, "e_item", default=default),
                EmbeddingBinding("hist", "items", 4, "e_hist", combiner="sum", default=default))
    graph = helper.make_graph(
        [helper.make_node("Concat", ["e_item", "e_hist"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["B", 4]) for n in ("e_item", "e_hist")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    spec = ModelSpec(embeddings=bindings, signatures={"serving_default": SignatureSpec(
        {"item": "item", "hist": "hist"}, {"y": "y"})})
    model_dir = write_model_dir(tmp_path / "model", model, spec)
    keys, values = np.arange(0, 100, 2, dtype=np.int64), rng.standard_normal((50, 4)).astype(np.float32)
    write_checkpoint(tmp_path / "ckpt", {"items": (keys, values)}, global_step=1)
    processor = Processor({"savedmodel_dir": str(model_dir), "checkpoint_dir": str(tmp_path / "ckpt")})
    try:
        item = np.array([2, 7, -5, 2**63 - 1], np.int64)
        hist = np.array([[1, 4, -1], [-1, -1, -1], [-7, 9, 11], [3, 3, 6]], np.int64)
        data = encode_request({"item": item, "hist": hist})
        _assert_native_equals_python(processor, data, monkeypatch)

        def row(k: int) -> np.ndarray:
            return values[k // 2] if k % 2 == 0 and 0 <= k < 100 else matrix[k % 3]

        want_item = np.array([row(int(k)) for k in item])
        want_hist = np.array([sum((row(int(k)) for k in r if k != -1), np.zeros(4, np.float32)) for r in hist])
        got = codec.decode_response(processor.process(data)[1])["y"]
        np.testing.assert_array_equal(got, np.concatenate([want_item, want_hist], axis=1).astype(np.float32))
    finally:
        processor.close()


def test_python_threads_get_the_python_routes_bytes_at_once(
    plain_processor: Processor, plain, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python threads enter the route together through _route_call (native/route_call.c: the
    GIL released around the C call): every answer, traced or not, from bytes, bytearray or
    memoryview bodies, is the Python route's, and each is served natively."""
    rng = np.random.default_rng(70)
    batches = [batch for batch in (1, 1, 1, 1, 2, 3, 8, 64) for _ in range(3)]
    requests = [encode_request(plain.sample(batch, rng)) for batch in batches]
    expected = [_python_route(plain_processor, r, monkeypatch) for r in requests]
    assert all(status == 200 for status, _ in expected)
    for r in requests:
        plain_processor.process(r)   # each layout's first request: Python registers its route
    version = plain_processor.model_info()["version"]
    rounds = 400
    before = _served(plain_processor)

    def caller(k: int) -> int:
        for i in range(rounds):
            j = (k * 7 + i) % len(requests)
            body = (requests[j], bytearray(requests[j]), memoryview(requests[j]))[i % 3]
            if k % 2:   # the servers' calls: with a trace, filled from the native route's clock
                trace = RequestTrace()
                assert plain_processor.process(body, trace=trace) == expected[j]
                assert [s.stage for s in trace.spans] == ["decode", "lookup", "run", "encode"]
                assert all(s.end_ns >= s.start_ns for s in trace.spans)
                assert trace.released_ns == trace.spans[-1].end_ns - trace.spans[0].start_ns > 0
                assert (trace.batch_size, trace.model_version) == (batches[j], version)
            else:
                assert plain_processor.process(body) == expected[j]
        return rounds

    served = sum(Threads([lambda k=k: caller(k) for k in range(4)], "Processor.process callers").join(WAIT * 4))
    assert _served(plain_processor) - before == served == 4 * rounds


def test_bad_bytes_like_bodies_get_the_python_routes_error(
    processor: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = encode_request(demo.sample_inputs(2, np.random.default_rng(61)))
    processor.process(data)   # the layout has a route: only the bytes below decide
    for bad in (data[:-3], b"\x0a\xff"):
        want = _python_route(processor, bad, monkeypatch)
        assert want[0] == 400 and b"not a valid tensorflow.eas.PredictRequest" in want[1]
        for body in (bad, bytearray(bad), memoryview(bad), memoryview(b"xx" + bad)[2:]):
            assert processor.process(body) == want
    # A body that is one buffer, but not contiguous, is the Python route's too (it copies it).
    strided = memoryview(bytearray(data * 2))[::2]
    assert processor.process(strided) == _python_route(processor, strided, monkeypatch)


def test_the_route_call_module_refuses_bad_arguments(processor: Processor) -> None:
    """_route_call is internal, but a wrong call must raise, never crash the process."""
    from recserve.processor import _route_call

    slot = processor.route_slot.address
    with pytest.raises(TypeError, match=r"process\(slot, data\) takes 2 arguments, not 1"):
        _route_call.process(slot)
    with pytest.raises(ValueError, match="the slot address must not be 0"):
        _route_call.process(0, b"\x0a")
    with pytest.raises(TypeError):
        _route_call.process("slot", b"\x0a")
    with pytest.raises(ValueError, match=r"the address of rs_route_process\(_tfs, _values, _many\) must not be 0"):
        _route_call.bind(0, 0, 0, 0)
    with pytest.raises(TypeError, match=r"bind\(process, process_tfs, process_values, process_many\) takes 4 "
                                        r"arguments, not 2"):
        _route_call.bind(0, 0)
    with pytest.raises(TypeError, match=r"process_many\(slot, payloads, max_rows\) takes 3 arguments, not 2"):
        _route_call.process_many(slot, [])
    with pytest.raises(ValueError, match="process_many: the slot address must not be 0"):
        _route_call.process_many(0, [b"\x0a"], 8)
    with pytest.raises(TypeError, match="process_many: payloads must be a list"):
        _route_call.process_many(slot, (b"\x0a",), 8)
    # Not a buffer, declined by the parser, empty: none served (the caller's Python path).
    assert _route_call.process_many(slot, ["not bytes", b"\x0a\xff", b"", memoryview(b"\x0a\xff")], 8) == [None] * 4
    assert _route_call.process_many(slot, [], 8) == []
    with pytest.raises(ValueError, match="process_values: the slot address must not be 0"):
        _route_call.process_values(0, b"", b"", b"")
    with pytest.raises(TypeError, match="process_values: argument 3 must be bytes"):
        _route_call.process_values(slot, b"", bytearray(8), b"")
    assert _route_call.process(slot, b"\x0a\xff") is None   # declined by the C parser: the caller's Python route
    assert _route_call.process_traced(slot, "not bytes", False) is None
