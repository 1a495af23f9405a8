"""`recserve serve --workers 2` as a real process tree (leader, zygote, two workers) on
real sockets: answers equal the in-process Processor's on every worker, updates and pins
reach every worker, a killed worker is replaced while the other keeps answering, SIGTERM
loses no accepted request, and a dead leader leaves no process behind (DESIGN §9)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from recserve import Processor
from recserve.export import write_checkpoint, write_delta
from recserve.export.demo import demo_tables, write_demo
from recserve.model_store.checkpoint import TableData
from recserve.wire.codec import decode_response, encode_request
from tests.server.conftest import UNHURRIED, settled
from tests.threads import Threads

pytestmark = pytest.mark.skipif(os.environ.get("RECSERVE_PURE_PYTHON") == "1",
                                reason="worker processes share tables through the native engine")


def children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return []
    return [int(p) for p in text.split()]


def worker_pids(leader: int) -> list[int]:
    """The leader's one child is the zygote; the workers are the zygote's children."""
    return [w for zygote in children(leader) for w in children(zygote)]


def workers_seen(url: str, tries: int = 200) -> set[int]:
    """Which workers answer `GET /models`, each on a fresh connection (the kernel spreads them)."""
    seen = set()
    for _ in range(tries):
        seen.add(httpx.get(f"{url}/models", timeout=10).json()["models"][0]["worker"])
        if len(seen) == 2:
            break
    return seen


def answers(url: str, body: bytes, count: int) -> list[np.ndarray]:
    out = []
    for _ in range(count):
        response = httpx.post(f"{url}/api/predict/default", content=body, timeout=30)  # a fresh connection each
        assert response.status_code == 200, response.text
        out.append(decode_response(response.content)["probabilities"])
    return out


def answered_total(url: str) -> float:
    """recserve_requests_total of every model and route answered 200, in /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith('recserve_requests_total{code="200"'))


@pytest.fixture
def pool_demo(tmp_path: Path):
    """A demo of its own (the tests write versions into it), polled every 0.2 s."""
    demo = write_demo(tmp_path / "demo")
    config = {**demo.config(), "model_update_interval_seconds": 0.2}
    return demo, config


def test_every_worker_answers_like_the_processor(launch, demo, demo_processor):
    running = launch(json.loads(demo.config_path.read_text()), workers=2)
    assert workers_seen(running.url) == {0, 1}
    inputs = demo.sample_inputs(64, np.random.default_rng(5))
    body = encode_request(inputs, output_filter=["probabilities"])
    expected = demo_processor.predict(inputs, ["probabilities"])["probabilities"]
    for got in answers(running.url, body, 40):
        np.testing.assert_array_equal(got, expected)
    # KServe v2 and TF Serving REST JSON: Processor.predict on each worker (the native route).
    as_lists = {k: [v.decode() for v in a.tolist()] if a.dtype == object else a.tolist() for k, a in inputs.items()}
    v2_types = {"f": "FP32", "i": "INT64", "O": "BYTES"}
    v2 = {"inputs": [{"name": k, "shape": list(a.shape), "datatype": v2_types[a.dtype.kind], "data": as_lists[k]}
                     for k, a in inputs.items()], "outputs": [{"name": "probabilities"}]}
    for _ in range(10):   # fresh connections: both workers
        kserve = httpx.post(f"{running.url}/v2/models/default/infer", json=v2, timeout=30)
        assert kserve.status_code == 200, kserve.text
        got = np.array(kserve.json()["outputs"][0]["data"], np.float32).reshape(expected.shape)
        np.testing.assert_array_equal(got, expected)
        rest = httpx.post(f"{running.url}/v1/models/default:predict", json={"inputs": as_lists}, timeout=30)
        assert rest.status_code == 200, rest.text
        np.testing.assert_array_equal(np.array(rest.json()["outputs"]["probabilities"], np.float32), expected)
    assert len(worker_pids(running.process.pid)) == 2
    # /metrics on one worker counts every worker's requests (41+: the loop above and more),
    # the other's once it flushed them.
    total = settled(lambda: answered_total(running.url), lambda n: n >= 40)
    assert total >= 40, httpx.get(f"{running.url}/metrics", timeout=10).text


def per_request_series(url: str) -> tuple[float, float, float, float]:
    """(answered, latency observations, rows, handler CPU seconds) of the default model's
    EAS route in /metrics."""
    text = httpx.get(f"{url}/metrics", timeout=10)
    assert text.status_code == 200, text.text
    wanted = ('recserve_requests_total{code="200",model="default",route="eas"}',
              'recserve_request_seconds_count{model="default",route="eas"}',
              'recserve_batch_size_sum{model="default"}',
              'recserve_request_cpu_seconds_total{model="default",route="eas"}')
    values = dict(line.rsplit(" ", 1) for line in text.text.splitlines() if line.startswith(wanted))
    return tuple(float(values.get(name, 0.0)) for name in wanted)  # type: ignore[return-value]


def test_a_pools_metrics_count_each_request_once(launch, demo):
    """Each worker records into its own numbers and adds them to the shared files in bulk:
    /metrics on either worker reads every request once, flushed, and again on later scrapes."""
    running = launch(json.loads(demo.config_path.read_text()) | UNHURRIED, workers=2)
    assert workers_seen(running.url) == {0, 1}
    body = encode_request(demo.sample_inputs(3, np.random.default_rng(11)), output_filter=["probabilities"])
    answers(running.url, body, 30)   # a fresh connection each: both workers
    want = (30.0, 30.0, 90.0)
    got = settled(lambda: per_request_series(running.url), lambda values: values[:3] == want)
    assert got[:3] == want and got[3] > 0, got
    for _ in range(6):   # scrapes on fresh connections (both workers' flushes): nothing added twice
        again = per_request_series(running.url)
        assert again[:3] == want and again[3] == pytest.approx(got[3], rel=1e-9), (again, got)


def alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_a_stopped_workers_last_requests_stay_counted(launch, demo):
    """SIGTERM a worker right after its requests: it adds what it has not flushed yet to the
    files before it exits, and the pool's /metrics (its replacement's) reads them."""
    running = launch(json.loads(demo.config_path.read_text()) | UNHURRIED, workers=2)
    assert workers_seen(running.url) == {0, 1}
    body = encode_request(demo.sample_inputs(2, np.random.default_rng(12)), output_filter=["probabilities"])
    answers(running.url, body, 20)
    stopped = worker_pids(running.process.pid)
    assert len(stopped) == 2
    for pid in stopped:   # both, at once: no request after these, no scrape before their exit
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in stopped):
        assert time.monotonic() < deadline, f"workers {stopped} still running 60 s after SIGTERM:\n{running.log()}"
        time.sleep(0.05)

    def replacements() -> tuple[float, ...] | None:
        try:
            return per_request_series(running.url)
        except httpx.TransportError:
            return None   # no worker listening yet

    got = settled(replacements, lambda values: values is not None, seconds=120)
    assert got is not None, f"no replacement worker answered /metrics in 120 s:\n{running.log()}"
    # Every writer of these series has exited: the files hold all they will ever hold.
    assert got[:3] == (20.0, 20.0, 40.0) and got[3] > 0, got
    assert running.log().count("exited (exit status 0); restarting it") == 2


def test_updates_and_pins_reach_every_worker(launch, pool_demo):
    demo, config = pool_demo
    running = launch(config, workers=2)
    inputs = demo.sample_inputs(32, np.random.default_rng(6))
    body = encode_request(inputs, output_filter=["probabilities"])

    def reference() -> np.ndarray:
        processor = Processor(config)
        try:
            return processor.predict(inputs, ["probabilities"])["probabilities"]
        finally:
            processor.close()

    def settles_on(expected: np.ndarray, what: str) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(np.array_equal(got, expected) for got in answers(running.url, body, 20)):
                return
            time.sleep(0.2)
        pytest.fail(f"workers did not all serve {what}:\n{running.log()}")

    before = reference()
    # A delta changing every row of the user table: the leader writes the shared rows once.
    tables = demo_tables()
    user = tables["user"]
    write_delta(demo.version_dir, {"user": TableData(user.keys, user.values * -2.0)}, global_step=2)
    after_delta = reference()
    assert not np.array_equal(before, after_delta)
    settles_on(after_delta, "the delta")

    # A new full version with other rows: built once, every worker switches.
    write_checkpoint(demo.checkpoint_dir, {name: TableData(t.keys, t.values * 0.5) for name, t in tables.items()},
                     global_step=10)
    shutil.rmtree(demo.version_dir / ".incremental_ckpt", ignore_errors=True)
    version_10 = reference()
    settles_on(version_10, "version 10")
    assert {m["version"] for m in (httpx.get(f"{running.url}/models").json()["models"][0] for _ in range(10))} == {"10"}

    # An admin pin answered by one worker holds for every worker as soon as it returns.
    response = httpx.post(f"{running.url}/admin/models/default/pin", json={"version": "1"}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == "1"
    shutil.move(demo.checkpoint_dir / "10", demo.root / "v10")  # the reference sees version 1 again
    pinned = reference()
    for got in answers(running.url, body, 20):
        np.testing.assert_array_equal(got, pinned)



def test_killed_worker_is_replaced_while_the_other_answers(launch, demo, demo_processor):
    running = launch(json.loads(demo.config_path.read_text()) | UNHURRIED, workers=2)
    inputs = demo.sample_inputs(8, np.random.default_rng(7))
    body = encode_request(inputs, output_filter=["probabilities"])
    expected = demo_processor.predict(inputs, ["probabilities"])["probabilities"]
    results: list[bool] = []
    stop = threading.Event()

    def load() -> int:
        requests = 0
        with httpx.Client(timeout=10) as client:
            while not stop.is_set():
                requests += 1
                try:
                    response = client.post(f"{running.url}/api/predict/default", content=body)
                    results.append(response.status_code == 200 and np.array_equal(
                        decode_response(response.content)["probabilities"], expected))
                except httpx.TransportError:
                    results.append(False)  # its connection was on the killed worker
        return requests

    def answered(count: int, what: str) -> None:
        deadline = time.monotonic() + 120
        while len(results) < count:
            assert time.monotonic() < deadline, f"{len(results)} of {count} requests answered {what} in 120 s"
            time.sleep(0.05)

    threads = Threads([load] * 4, "HTTP clients")
    try:
        answered(100, "before the kill")
        victim = worker_pids(running.process.pid)[0]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.monotonic()
        replaced = None
        while time.monotonic() - killed_at < 60:
            pids = worker_pids(running.process.pid)
            if len(pids) == 2 and victim not in pids and httpx.get(f"{running.url}/v2/health/ready").status_code == 200:
                replaced = time.monotonic() - killed_at
                break
            time.sleep(0.05)
        answered(len(results) + 100, "after the replacement")
    finally:
        stop.set()
    assert min(threads.join(timeout=60)) > 0
    assert replaced is not None, running.log()
    failed = results.count(False)
    assert len(results) > 200 and failed <= 0.01 * len(results), (failed, len(results))
    log = running.log()
    assert f"(pid {victim}) exited (killed by SIGKILL); restarting it" in log
    assert "recserve_worker_restarts_total 1.0" in httpx.get(f"{running.url}/metrics").text


def test_sigterm_drains_every_worker_and_exits_0(launch, demo, demo_processor):
    running = launch(json.loads(demo.config_path.read_text()) | UNHURRIED, workers=2)
    inputs = demo.sample_inputs(1024, np.random.default_rng(8))
    body = encode_request(inputs, output_filter=["probabilities"])
    expected = demo_processor.predict(inputs, ["probabilities"])["probabilities"]
    release = threading.Event()

    half_sent = threading.Semaphore(0)

    def held_body():
        yield body[: len(body) // 2]
        half_sent.release()
        assert release.wait(60), "SIGTERM not sent within 60 s of a held request's first half"
        yield body[len(body) // 2:]

    # Half-sent requests on fresh connections: the kernel puts them on both workers.
    threads = Threads([lambda: httpx.post(f"{running.url}/api/predict/default", content=held_body(), timeout=60)] * 6,
                      "held requests")
    for n in range(6):
        assert half_sent.acquire(timeout=60), f"{n} of 6 held requests sent their first half in 60 s"
    time.sleep(1.0)  # both workers have read the headers and half the bodies
    workers = worker_pids(running.process.pid)
    running.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    release.set()
    results = threads.join(timeout=120)
    assert running.process.wait(60) == 0, running.log()
    assert len(results) == 6
    for response in results:
        assert response.status_code == 200, response.text
        np.testing.assert_array_equal(decode_response(response.content)["probabilities"], expected)
    assert all(not Path(f"/proc/{pid}").exists() for pid in workers)
    assert running.log().count("recserve stopped") == 3  # two workers, then the leader


def test_a_dead_leader_leaves_no_process_behind(launch, demo):
    running = launch(json.loads(demo.config_path.read_text()), workers=2)
    tree = children(running.process.pid) + worker_pids(running.process.pid)
    assert len(tree) == 3
    running.process.send_signal(signal.SIGKILL)
    running.process.wait(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}/stat").exists() and
                                              Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
                                              for pid in tree):
        time.sleep(0.05)
    alive = [pid for pid in tree if Path(f"/proc/{pid}/stat").exists()
             and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert alive == []


def test_pool_refuses_what_it_cannot_share(tmp_path, demo):
    import subprocess
    import sys

    config = {**json.loads(demo.config_path.read_text()), "ev_storage_type": 12,
              "ev_storage_path": str(tmp_path / "ssd"), "ev_storage_size": [1 << 20, 1 << 30]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    tiered = ("keeps its tables on DRAM + SSD tiers (ev_storage_type 12): worker processes "
              "share in-memory tables only so far; serve it with --workers 1")
    for workers, message in ((2, tiered),
                             (0, "--workers must be a positive integer or 'auto', got '0'"),
                             (256, "--workers must be at most 255, got 256")):
        done = subprocess.run([sys.executable, "-m", "recserve.server.cli", "serve", "--config", str(path),
                               "--workers", str(workers)], check=False, capture_output=True, text=True, timeout=60)
        assert done.returncode == 2, done.stderr
        assert message in done.stderr


def test_workers_serve_redis_tables_as_replicas(launch, pool_demo, redis_server):
    """Tables in Redis are not shared memory: the leader imports the version and writes
    deltas once; each worker reads Redis with its own cache and follows the update stream."""
    demo, config = pool_demo
    config = {**config, "feature_store_type": "redis", "redis_url": redis_server.url}
    running = launch(config, workers=2)
    inputs = demo.sample_inputs(32, np.random.default_rng(9))
    body = encode_request(inputs, output_filter=["probabilities"])
    processor = Processor(config)
    try:
        expected = processor.predict(inputs, ["probabilities"])["probabilities"]
        for got in answers(running.url, body, 20):
            np.testing.assert_array_equal(got, expected)
        user = demo_tables()["user"]
        write_delta(demo.version_dir, {"user": TableData(user.keys, user.values * 3.0)}, global_step=2)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            after = processor.predict(inputs, ["probabilities"])["probabilities"]
            if not np.array_equal(after, expected) and all(
                    np.array_equal(got, after) for got in answers(running.url, body, 20)):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the delta did not reach every worker:\n{running.log()}")
    finally:
        processor.close()


def test_recording_and_timelines_cover_every_worker(launch, demo, tmp_path):
    """warmup record/save sample the traffic of the whole pool; each worker writes its own
    timelines, named after it."""
    from recserve.warmup.warmup_file import read_warmup_file

    timelines = tmp_path / "timelines"
    config = {**json.loads(demo.config_path.read_text()), "timeline_start_step": 0, "timeline_interval_step": 1,
              "timeline_trace_count": 3, "timeline_path": str(timelines)}
    running = launch(config, workers=2)
    response = httpx.post(f"{running.url}/admin/models/default/warmup/record", json={"requests": 10})
    assert response.status_code == 200, response.text
    bodies = {encode_request(demo.sample_inputs(2, np.random.default_rng(seed))) for seed in range(30)}
    for body in bodies:
        assert httpx.post(f"{running.url}/api/predict/default", content=body).status_code == 200
    path = tmp_path / "recorded.bin"
    response = httpx.post(f"{running.url}/admin/models/default/warmup/save", json={"path": str(path)})
    assert response.status_code == 200, response.text
    assert response.json() == {"path": str(path), "requests": 10, "seen": 30}
    recorded = read_warmup_file(path)
    assert len(recorded) == 10 and set(recorded) <= bodies
    # Saving stopped recording on every worker.
    again = httpx.post(f"{running.url}/admin/models/default/warmup/save", json={"path": str(path)})
    assert again.status_code == 409 and "is not recording" in again.json()["error"]
    names = sorted(p.name for p in timelines.glob("*.json"))
    assert {n.split("-")[2] for n in names} == {"w0", "w1"}, names
