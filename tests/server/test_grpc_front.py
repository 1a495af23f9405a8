"""The gRPC port's C++ front end (recserve.server.grpc_front) in a real `recserve serve`:
EAS Predict answered on the native route byte for byte as `Processor.process` answers in
this process, with the version in the trailing metadata; every other call forwarded to the
grpcio servicers with its errors, metadata and streams unchanged; the call limit; and each
call counted once in /metrics.

Like test_server_grpc, this module must not import recserve's KServe protos
(recserve.server.grpc_services does): tritonclient registers the same messages; what it
reads of the server's modules it reads in a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import grpc
import httpx
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from recserve.export.demo import write_demo
from recserve.wire.codec import encode_request
from tests.server.conftest import ROOT, UNHURRIED, settled

PREDICT = "/tensorflow.eas.PredictionService/Predict"
TOKEN = "front-token"


def _metric(url: str, name: str, client: httpx.Client | None = None, **labels: str) -> float:
    """One sample of /metrics (0 when absent); through `client`'s connection if given."""
    text = (client or httpx).get(f"{url}/metrics", timeout=30).text
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)\{(.*)\} (\S+)", line)
        if match and match[1] == name and dict(re.findall(r'(\w+)="([^"]*)"', match[2])) == labels:
            return float(match[3])
    return 0.0


def _server_side() -> dict[str, int]:
    """What this machine's server is built and sized with."""
    script = ("import json; from recserve.server import grpc_front, grpc_services, runner; "
              "print(json.dumps({'front': grpc_front.available(), 'workers': runner.WORKERS, "
              "'headroom': grpc_services.WATCH_HEADROOM}))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def test_the_front_end_is_built():
    """`make install` installs grpc++ (Debian's libgrpc++-dev) before building: without it
    the port would be grpcio's alone and the tests below would test that instead."""
    assert _server_side()["front"], "librecserve_grpc_front.so was not built: is libgrpc++-dev installed?"


def test_native_predicts_are_the_processors_answers(launch, demo, demo_processor):
    running = launch(demo.config() | UNHURRIED)
    bodies = [encode_request(demo.sample_inputs(batch, np.random.default_rng(batch))) for batch in (1, 3, 64)]
    with grpc.insecure_channel(running.grpc_address) as channel:
        predict = channel.unary_unary(PREDICT)
        for body in bodies:
            want = demo_processor.process(body)
            assert want[0] == 200
            for _ in range(3):   # a layout's first call is Python's (it compiles the route), then native
                answer, call = predict.with_call(body, timeout=30)
                assert answer == want[1]
                assert dict(call.trailing_metadata()) == {"x-recserve-model-version": "1",
                                                          "x-recserve-delta-step": "0"}
    native = _metric(running.url, "recserve_grpc_front_calls_total", path="native")
    forwarded = _metric(running.url, "recserve_grpc_front_calls_total", path="forwarded")
    assert native >= 6 and native + forwarded == 9, (native, forwarded)
    # Each call counted once, wherever it was answered, with its rows.
    assert _metric(running.url, "recserve_requests_total", model="default", route="eas_grpc", code="200") == 9
    assert _metric(running.url, "recserve_request_seconds_count", model="default", route="eas_grpc") == 9
    assert _metric(running.url, "recserve_batch_size_sum", model="default") == 3 * (1 + 3 + 64)
    assert _metric(running.url, "recserve_request_cpu_seconds_total", model="default", route="eas_grpc") > 0


def test_a_pools_native_calls_are_counted_once(launch, demo, demo_processor):
    """--workers 2: each worker's C++ counts reach the shared files on the metrics' flush
    thread (no scrape of that worker needed), each call once."""
    running = launch(demo.config() | UNHURRIED, workers=2)
    body = encode_request(demo.sample_inputs(2, np.random.default_rng(21)))
    want = demo_processor.process(body)
    for _ in range(12):   # a channel each: the kernel spreads them over both workers
        with grpc.insecure_channel(running.grpc_address) as channel:
            assert channel.unary_unary(PREDICT)(body, timeout=30) == want[1]

    # One connection, so one worker's /metrics: the other's counts come by its thread alone.
    with httpx.Client() as client:
        def counted() -> tuple[float, ...]:
            return (_metric(running.url, "recserve_requests_total", client, model="default", route="eas_grpc",
                            code="200"),
                    _metric(running.url, "recserve_batch_size_sum", client, model="default"),
                    _metric(running.url, "recserve_grpc_front_calls_total", client, path="native")
                    + _metric(running.url, "recserve_grpc_front_calls_total", client, path="forwarded"))

        assert settled(counted, lambda got: got == (12, 24, 12)) == (12, 24, 12)
    # A layout's first call on each worker is Python's (it compiles the route), then native.
    assert _metric(running.url, "recserve_grpc_front_calls_total", path="native") >= 10


def test_forwarded_calls_keep_their_errors_and_metadata(launch, tmp_path, demo, demo_processor):
    other = write_demo(tmp_path / "other")
    running = launch({"models": [{"name": "ranker", "model_config": demo.config() | UNHURRIED},
                                 {"name": "recall", "model_config": other.config() | UNHURRIED}]})
    body = encode_request(demo.sample_inputs(2, np.random.default_rng(5)))
    with grpc.insecure_channel(running.grpc_address) as channel:
        predict = channel.unary_unary(PREDICT)
        for _ in range(3):
            answer, call = predict.with_call(body, metadata=[("model", "recall")], timeout=30)
            assert answer == demo_processor.process(body)[1]
            assert dict(call.trailing_metadata())["x-recserve-model-version"] == "1"
        with pytest.raises(grpc.RpcError) as unnamed:
            predict(body, timeout=30)
        assert unnamed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert unnamed.value.details() == ("this server serves several models ['ranker', 'recall']: name one in "
                                           "the call's metadata key 'model'")
        with pytest.raises(grpc.RpcError) as unknown:
            predict(body, metadata=[("model", "nope")], timeout=30)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert unknown.value.details() == "unknown model 'nope'; this server serves ['ranker', 'recall']"
        with pytest.raises(grpc.RpcError) as garbage:
            predict(b"\xff\x01", metadata=[("model", "ranker")], timeout=30)
        assert garbage.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert garbage.value.details().startswith("request is not a valid tensorflow.eas.PredictRequest")
        with pytest.raises(grpc.RpcError) as absent:
            channel.unary_unary("/tensorflow.eas.PredictionService/Nope")(b"", timeout=30)
        assert absent.value.code() == grpc.StatusCode.UNIMPLEMENTED
    assert _metric(running.url, "recserve_grpc_front_calls_total", path="native") >= 2


def test_a_recording_model_is_served_by_python(launch, demo):
    """While a model records a warmup sample every Predict of it reaches Python, which
    records it: a layout's repeated calls included (the front end would answer those)."""
    running = launch(demo.config() | UNHURRIED, env={"RECSERVE_ADMIN_TOKEN": TOKEN})
    auth = {"Authorization": f"Bearer {TOKEN}"}
    admin = f"{running.url}/admin/models/default/warmup"
    body = encode_request(demo.sample_inputs(4, np.random.default_rng(4)))
    with grpc.insecure_channel(running.grpc_address) as channel:
        predict = channel.unary_unary(PREDICT)
        for _ in range(3):
            predict(body, timeout=30)
        native_before = _metric(running.url, "recserve_grpc_front_calls_total", path="native")
        assert native_before >= 2
        assert httpx.post(f"{admin}/record", json={"requests": 64}, headers=auth).status_code == 200
        for _ in range(3):
            predict(body, timeout=30)
        saved = httpx.post(f"{admin}/save", json={"path": str(running.log_path.parent / "rec.bin")}, headers=auth)
        assert saved.status_code == 200, saved.text
        assert saved.json()["seen"] == 3
        assert _metric(running.url, "recserve_grpc_front_calls_total", path="native") == native_before
        predict(body, timeout=30)   # recording over: native again
    assert _metric(running.url, "recserve_grpc_front_calls_total", path="native") == native_before + 1


def test_the_call_limit_refuses_and_cancelled_streams_give_their_places_back(launch, demo):
    """Calls beyond the server's limit (its worker threads, every model's
    max_queued_requests, and room for Health watches) are refused RESOURCE_EXHAUSTED before
    being read; streams that end, cancelled by their clients, give their places back."""
    running = launch(demo.config() | {"max_queued_requests": 1})
    side = _server_side()
    limit = side["workers"] + 1 + side["headroom"]
    body = encode_request(demo.sample_inputs(1, np.random.default_rng(1)))
    request = health_pb2.HealthCheckRequest(service="")
    with grpc.insecure_channel(running.grpc_address) as channel:
        predict = channel.unary_unary(PREDICT)
        predict(body, timeout=30)   # the layout's first call (Python's): later ones are native
        health = health_pb2_grpc.HealthStub(channel)
        for round_ in range(2):
            watches = [health.Watch(request, timeout=120) for _ in range(limit)]
            deadline = time.monotonic() + 60
            while True:   # the watches reach the server in their own time: until a call is refused
                # A watch grpcio refused (its places of the last round not yet given back
                # there) ended: another takes its place.
                watches = [w if not w.done() else health.Watch(request, timeout=120) for w in watches]
                try:
                    predict(body, timeout=30)
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    assert "maximum of calls in flight" in exc.details()
                    break
                assert time.monotonic() < deadline, f"round {round_}: no call refused with {limit} watches open"
                time.sleep(0.05)
            for watch in watches:
                watch.cancel()
            deadline = time.monotonic() + 60
            while True:
                try:
                    predict(body, timeout=30)
                    break
                except grpc.RpcError as exc:
                    assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
                    assert time.monotonic() < deadline, f"round {round_}: places not given back"
                    time.sleep(0.05)
    assert _metric(running.url, "recserve_grpc_front_calls_total", path="refused") >= 2


def test_tf_serving_predicts_are_answered_natively_as_python_answers_them(launch, demo):
    """A TF Serving Predict's first call of its layout is Python's (tfserving_grpc); the
    front end answers the next ones natively, byte for byte the same, model_spec included;
    a version or label the model does not serve is Python's NOT_FOUND."""
    from recserve.wire.tfserving_codec import encode_predict_request

    running = launch(demo.config() | UNHURRIED)
    inputs = demo.sample_inputs(5, np.random.default_rng(9))
    plain = encode_predict_request(inputs, "default")
    with grpc.insecure_channel(running.grpc_address) as channel:
        predict = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")
        for data in (plain, encode_predict_request(inputs, "default", version=1, signature_name="serving_default")):
            first, call = predict.with_call(data, timeout=30)
            assert dict(call.trailing_metadata())["x-recserve-model-version"] == "1"
            native_before = _metric(running.url, "recserve_grpc_front_calls_total", path="native")
            for _ in range(2):
                answer, call = predict.with_call(data, timeout=30)
                assert answer == first
                assert dict(call.trailing_metadata()) == {"x-recserve-model-version": "1",
                                                          "x-recserve-delta-step": "0"}
            assert _metric(running.url, "recserve_grpc_front_calls_total", path="native") == native_before + 2
        with pytest.raises(grpc.RpcError) as wrong:
            predict(encode_predict_request(inputs, "default", version=7), timeout=30)
        assert wrong.value.code() == grpc.StatusCode.NOT_FOUND
        assert wrong.value.details().startswith("Servable not found for request: Specific(default, 7)")
    assert _metric(running.url, "recserve_requests_total", model="default", route="tfserving_grpc", code="200") == 6


def test_a_dynamically_batching_model_is_served_by_python(launch, demo, demo_processor):
    """max_batch_size > 0: the batcher is Python's, and a call waiting in it must not hold a
    grpc++ thread: every Predict is forwarded, and answered as Processor.process answers."""
    running = launch(demo.config() | UNHURRIED | {"max_batch_size": 8, "batch_timeout_micros": 1000})
    body = encode_request(demo.sample_inputs(2, np.random.default_rng(2)))
    with grpc.insecure_channel(running.grpc_address) as channel:
        predict = channel.unary_unary(PREDICT)
        for _ in range(3):
            assert predict(body, timeout=30) == demo_processor.process(body)[1]
    assert _metric(running.url, "recserve_grpc_front_calls_total", path="native") == 0
    assert _metric(running.url, "recserve_grpc_front_calls_total", path="forwarded") == 3


def test_concurrent_native_forwarded_cancelled_and_late_calls(launch, demo, demo_processor):
    """Native and forwarded calls at once, with streams cancelled and calls timing out
    midway (the front end then cancels what it forwarded): every answer exact, the server
    keeps serving and stops cleanly. A crash or a lost reference in the front end's call
    handling shows here (tests/server runs it under ASan too, make test-sanitize)."""
    from recserve.wire.tfserving_codec import encode_predict_request

    running = launch(demo.config() | UNHURRIED)
    rng = np.random.default_rng(12)
    eas = [encode_request(demo.sample_inputs(b, rng)) for b in (1, 4, 16)]
    tfs_inputs = demo.sample_inputs(3, rng)
    tfs = encode_predict_request(tfs_inputs, "default")
    want = {body: demo_processor.process(body)[1] for body in eas}
    errors: list[BaseException] = []
    stop = time.monotonic() + 8

    def guarded(work: Callable[[grpc.Channel], None]) -> Callable[[], None]:
        """A client thread's body: `work` in a loop; its exception fails the test."""
        def run() -> None:
            try:
                with grpc.insecure_channel(running.grpc_address) as channel:
                    while time.monotonic() < stop and not errors:
                        work(channel)
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)
        return run

    def native(channel: grpc.Channel) -> None:
        for body in eas:
            assert channel.unary_unary(PREDICT)(body, timeout=30) == want[body]

    tfs_first: list[bytes] = []

    def tf_serving(channel: grpc.Channel) -> None:
        answer = channel.unary_unary("/tensorflow.serving.PredictionService/Predict")(tfs, timeout=30)
        if not tfs_first:
            tfs_first.append(answer)
        assert answer == tfs_first[0]

    def late(channel: grpc.Channel) -> None:
        for body in (eas[2], b"\xff\x01"):   # native, and forwarded (Python answers its error)
            try:
                channel.unary_unary(PREDICT)(body, timeout=0.0005)
            except grpc.RpcError as exc:
                assert exc.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INVALID_ARGUMENT), exc

    def watches(channel: grpc.Channel) -> None:
        stub = health_pb2_grpc.HealthStub(channel)
        streams = [stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30) for _ in range(3)]
        time.sleep(0.01)
        for stream in streams:
            stream.cancel()

    threads = [threading.Thread(target=guarded(work)) for work in (native, native, tf_serving, late, watches)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not any(t.is_alive() for t in threads), "a client thread hung"
    assert not errors, errors[0]
    with grpc.insecure_channel(running.grpc_address) as channel:
        assert channel.unary_unary(PREDICT)(eas[0], timeout=30) == want[eas[0]]
    assert running.stop() == 0, running.log()


def test_without_the_front_end_grpcio_serves_the_port(launch, demo, demo_processor):
    """RECSERVE_GRPC_FRONT=0 (as a build without grpc++): grpcio listens on the port itself
    and answers the same bytes; nothing goes through a front end."""
    running = launch(demo.config() | UNHURRIED, env={"RECSERVE_GRPC_FRONT": "0"})
    body = encode_request(demo.sample_inputs(3, np.random.default_rng(3)))
    with grpc.insecure_channel(running.grpc_address) as channel:
        for _ in range(3):
            answer, call = channel.unary_unary(PREDICT).with_call(body, timeout=30)
            assert answer == demo_processor.process(body)[1]
            assert dict(call.trailing_metadata())["x-recserve-model-version"] == "1"
    assert "recserve_grpc_front_calls_total{" not in httpx.get(f"{running.url}/metrics", timeout=30).text
    assert _metric(running.url, "recserve_requests_total", model="default", route="eas_grpc", code="200") == 3


def test_open_health_watches_hold_no_python_thread(launch, demo):
    """Health's Watch streams are kept by the front end: many more of them than grpcio has
    worker threads leave every forwarded call served at once, and see each status."""
    running = launch(demo.config() | UNHURRIED)
    side = _server_side()
    with grpc.insecure_channel(running.grpc_address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        watches = [health.Watch(health_pb2.HealthCheckRequest(service=service), timeout=60)
                   for service in ["", "default", "nope"] * (side["workers"] + 2)]
        statuses = [next(watch).status for watch in watches]
        assert statuses == [health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.SERVING,
                            health_pb2.HealthCheckResponse.SERVICE_UNKNOWN] * (side["workers"] + 2)
        # Forwarded calls (grpcio's servicers), each needing a worker thread.
        info = channel.unary_unary("/tensorflow.eas.PredictionService/GetServingModelInfo")
        for _ in range(side["workers"] * 2):
            assert info(b"", timeout=10)
        assert health.Check(health_pb2.HealthCheckRequest(service="default"), timeout=10).status == \
            health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as unknown:   # Python's answer, forwarded
            health.Check(health_pb2.HealthCheckRequest(service="nope"), timeout=10)
        assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
        assert unknown.value.details() == "unknown service 'nope'"
        for watch in watches:
            watch.cancel()
