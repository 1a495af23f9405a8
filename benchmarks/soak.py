"""The chaos soak (issue #12, part 3): `python -m benchmarks soak --minutes N [--workers K]`.

`recserve serve` (worker processes by default) serves the demo under steady HTTP and gRPC
load from two client processes, while every few seconds a fault or an update lands: a
delta, a new full version, a full version whose files are deleted while it loads, a
version with a flipped byte, a worker killed with SIGKILL. Every answer is checked against
the version and delta step it names (X-Recserve-Model-Version / -Delta-Step headers, gRPC
trailing metadata): its prediction must equal the numpy + onnxruntime reference's on that
state (recserve/export/reference.py, within REFERENCE_ATOL; or on a later delta of the same
version: a delta lands table by table while the step is named after it). Reports requests sent, failed and wrong, p50/p99 per phase, and the server
tree's memory, open files and threads at start and end.

With `--store s3` the model and its versions live in an S3 bucket (moto's server) read
through a proxy that misbehaves on demand (benchmarks/fault_proxy.py), and three more faults
join the turn, each while a new full version lands: the store answers reads with 500s, holds
every answer 2 s, or cuts objects short.

With `--tables redis` the tables live in a redis-server (each process caching one row per
table, so lookups read Redis), which is SIGKILLed and restarted empty in turn. With `--tables tiered`
they live on DRAM + SSD tiers (one process: tiered tables are not shared with workers) whose
ev_storage_path is a small tmpfs, filled to the last byte while a new full version lands.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.load_tools import free_port, process_tree, tree_memory, wait_ready
from benchmarks.redis_server import RedisServer
from benchmarks.soak_stores import Bucket, SmallDisk
from recserve.export import write_checkpoint, write_delta
from recserve.export.demo import demo_tables, write_demo
from recserve.export.reference import Reference
from recserve.model_store.checkpoint import TableData
from recserve.wire.codec import encode_request

ROOT = Path(__file__).resolve().parent.parent
WARMUP_SECONDS = 10.0
REQUESTS = 8  # distinct requests, batch 1 (a row is entirely old or new: one answer per state)
# The reference runs the graph with the rows as initializers, the server feeds them as
# inputs: the same ONNX Runtime kernels, a float32 rounding apart at most.
REFERENCE_ATOL = 1e-6
FAILED_CALL_PAUSE = 0.01  # seconds a client waits after a failed call before its next one


def _client(kind: str, url: str, grpc_address: str, bodies: list[bytes], stop: object, out: object) -> None:
    """Sends requests until `stop` is set; puts (time, phase-free result) tuples on `out`."""
    import grpc
    import httpx

    from recserve.proto import eas_service_pb2_grpc, predict_pb2
    from recserve.wire.codec import decode_response

    results = []
    # A channel whose connection died fails calls at once until it reconnects; grpc's default
    # first backoff is 1 s (the soak's clients reconnect within 0.1 s, as a tuned client does).
    channel = grpc.insecure_channel(grpc_address, options=[
        ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000)])
    stub = eas_service_pb2_grpc.PredictionServiceStub(channel)
    client = httpx.Client(timeout=10)
    i = 0
    while not stop.is_set():  # type: ignore[attr-defined]
        index = i % len(bodies)
        i += 1
        started = time.monotonic()
        try:
            if kind == "http":
                if i % 16 == 0:
                    client.close()
                    client = httpx.Client(timeout=10)  # fresh connections reach other workers
                response = client.post(f"{url}/api/predict/default", content=bodies[index])
                ok = response.status_code == 200
                claim = (response.headers.get("x-recserve-model-version"), response.headers.get("x-recserve-delta-step")) \
                    if ok else (f"status {response.status_code}", response.text[:120])
                value = decode_response(response.content)["probabilities"].tobytes() if ok else b""
            else:
                reply, call = stub.Predict.with_call(predict_pb2.PredictRequest.FromString(bodies[index]), timeout=10)
                meta = dict(call.trailing_metadata())
                ok, claim = True, (meta.get("x-recserve-model-version"), meta.get("x-recserve-delta-step"))
                value = decode_response(reply.SerializeToString())["probabilities"].tobytes()
        except Exception as exc:  # noqa: BLE001  (counted as failed, by what failed)
            code = getattr(exc, "code", None)
            details = getattr(exc, "details", None)
            ok, claim, value = False, (f"{type(exc).__name__} {code() if callable(code) else ''}".strip(),
                                       str(details() if callable(details) else exc)[:120]), b""
        results.append((started, time.monotonic() - started, kind, index, ok, claim, value))
        if not ok:
            # As a real client backs off: a channel whose connection died fails every call
            # at once until it reconnects, and a client retrying in a tight loop would count
            # thousands of failures for one outage of a second.
            time.sleep(FAILED_CALL_PAUSE)
        if len(results) >= 200:
            out.put(results)  # type: ignore[attr-defined]
            results = []
    out.put(results)  # type: ignore[attr-defined]
    channel.close()


def _answering_again(url: str, body: bytes, *, in_a_row: int = 20, timeout: float = 60.0) -> float:
    """Seconds until `in_a_row` requests, each on a new connection (so reaching any
    process), were answered 200; `timeout` if they never were."""
    import httpx

    started = time.monotonic()
    good = 0
    while good < in_a_row and time.monotonic() - started < timeout:
        try:
            good = good + 1 if httpx.post(f"{url}/api/predict/default", content=body, timeout=5).status_code == 200 else 0
        except httpx.HTTPError:
            good = 0
        if not good:
            time.sleep(0.02)
    return time.monotonic() - started


def _wait_whole(pid: int, processes: int, timeout: float = 30.0) -> None:
    """Until the server's tree has `processes` processes again (a killed worker restarted)."""
    deadline = time.monotonic() + timeout
    while len(process_tree(pid)) < processes and time.monotonic() < deadline:
        time.sleep(0.2)


def _tree_stats(pid: int) -> dict[str, int]:
    fds = threads = 0
    for q in process_tree(pid):
        try:
            fds += len(os.listdir(f"/proc/{q}/fd"))
            threads += len(os.listdir(f"/proc/{q}/task"))
        except FileNotFoundError:
            pass
    memory = tree_memory(pid)
    # Pss split: mapped files (table files, the SSD tier's records) come and go with the
    # versions and the page cache; anonymous memory is what a leak would grow.
    return {"pss_mib": memory["Pss"] >> 20, "pss_anon_mib": memory["Pss_Anon"] >> 20,
            "pss_file_mib": memory["Pss_File"] >> 20, "fds": fds, "threads": threads,
            "processes": len(process_tree(pid))}


# Faults that stop requests from being answered, each for its own window: a killed worker's
# requests in flight, and lookups that miss the cache while Redis is down. Failures in other
# phases are the soak's findings.
OUTAGES = ("kill_worker", "redis_restart")
# The turn of faults: these always; the others when the store, Redis or the small disk is
# there. "steady": nothing happens, so that steady latency is sampled all along the run,
# under the conditions the faults meet (caches, memory, the machine's other load).
TURN = ("delta", "full", "kill_worker", "deleted_mid_load", "corrupt", "delta", "steady")
STORE_TURN = ("store_error", "store_slow", "store_truncated", "steady")
REDIS_TURN = ("redis_restart", "delta")
DISK_TURN = ("disk_full",)
SLOTS = tuple(dict.fromkeys(TURN + STORE_TURN + REDIS_TURN + DISK_TURN))  # for --faults


def soak(minutes: float, workers: int, every: float = 3.0, store: str = "local",
         tables_in: str = "memory", only: frozenset[str] = frozenset()) -> dict[str, object]:
    root = Path(tempfile.mkdtemp(prefix="recserve-soak-"))
    demo = write_demo(root / "demo")
    # Admission set aside (max_queue_ms): the soak counts what faults cost, and a loaded
    # machine's queueing would otherwise shed requests as 503s in any phase.
    local_config = {**demo.config(), "model_update_interval_seconds": 0.2, "max_queue_ms": 60_000}
    bucket = Bucket() if store == "s3" else None
    redis_server = RedisServer(root) if tables_in == "redis" else None
    if redis_server is not None:
        redis_server.start()
    disk = SmallDisk(root / "ssd") if tables_in == "tiered" else None
    config = dict(local_config)
    if redis_server is not None:
        # One row cached per table and process: lookups read Redis.
        config.update(feature_store_type="redis", redis_url=redis_server.url, redis_cache_rows=1)
    if disk is not None:
        workers = 1  # tiered tables are not shared between processes (README, worker processes)
        config.update(ev_storage_type=12, ev_storage_path=str(disk.path / "ev"),
                      ev_storage_size=[64 * 1024, 1 << 30])
    if bucket is not None:
        bucket.publish(demo.model_dir, "model")
        bucket.publish(demo.version_dir, f"ckpt/{demo.version_dir.name}")
        config.update(bucket.config())
        config.pop("warmup_file_name", None)
    config_path = root / "config.json"
    config_path.write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    requests = [demo.sample_inputs(1, rng) for _ in range(REQUESTS)]
    bodies = [encode_request(inputs, output_filter=["probabilities"]) for inputs in requests]
    http_port, grpc_port = free_port(), free_port()
    log = open(root / "server.log", "wb")  # noqa: SIM115  (the server's stdout for the whole soak)
    server = subprocess.Popen(
        [sys.executable, "-m", "recserve.server.cli", "serve", "--config", str(config_path), "--http-port",
         str(http_port), "--grpc-port", str(grpc_port), "--workers", str(workers)], cwd=ROOT, stdout=log,
        stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http_port}"
    wait_ready(f"{url}/v2/health/ready", server)

    expected: dict[tuple[str, str], list[np.ndarray]] = {}

    def reference(version: str, step: int, directory: Path) -> None:
        """The answers of state (version, step): the numpy + onnxruntime reference
        (recserve/export/reference.py) of that version dir as it is now, not a second
        recserve Processor, whose bugs would agree with the server's."""
        answers = Reference(demo.model_dir, directory)
        expected[(version, str(step))] = [answers.predict(inputs)["probabilities"] for inputs in requests]

    reference("1", 0, demo.version_dir)
    stop = multiprocessing.Event()
    out: multiprocessing.Queue = multiprocessing.Queue()
    clients = [multiprocessing.Process(target=_client, args=(kind, url, f"127.0.0.1:{grpc_port}", bodies, stop, out))
               for kind in ("http", "grpc")]
    for c in clients:
        c.start()
    phases: list[tuple[float, str]] = [(time.monotonic(), "warmup")]
    # Resources are compared with their values after a warm-up under load: threads (the
    # executor's, gRPC's) and connections are made as the first requests need them.
    time.sleep(min(WARMUP_SECONDS, minutes * 60 / 4))
    start_stats = _tree_stats(server.pid)
    phases.append((time.monotonic(), "steady"))
    version, step, version_dir = 1, 1, demo.version_dir
    tables = demo_tables()
    faults = list(TURN)
    if bucket is not None:
        faults += STORE_TURN
    if redis_server is not None:
        faults += REDIS_TURN
    if disk is not None and disk.mounted:
        faults += DISK_TURN
    if only:  # a subset of the turn, to find which fault a trend follows
        faults = [f for f in faults if f in only] or ["steady"]
    killed = 0
    recoveries: list[float] = []
    turn_stats: dict[str, int] | None = None

    def publish(directory: Path) -> None:
        if bucket is not None:
            bucket.publish(directory, f"ckpt/{directory.name}")
    end = time.monotonic() + minutes * 60
    n = 0
    while time.monotonic() < end:
        time.sleep(every)
        if n == len(faults) and end - time.monotonic() > 2 * n * every:
            # Resources again after one turn of every fault: pools, caches and allocator
            # arenas grow to what the faults need once; a leak goes on growing after it.
            _wait_whole(server.pid, start_stats["processes"])
            turn_stats = _tree_stats(server.pid)
        fault = faults[n % len(faults)]
        n += 1
        if fault == "kill_worker" and workers < 2:
            fault = "delta"
        phases.append((time.monotonic(), fault))
        if fault == "delta":
            step += 1
            user = tables["user"]
            changed = TableData(user.keys, (user.values * (1 + 0.01 * step)).astype(np.float32))
            write_delta(version_dir, {"user": changed}, global_step=step)
            reference(str(version), step, version_dir)
            publish(version_dir)
        elif fault == "full" or fault.startswith("store_") or fault == "disk_full":
            # A store fault or a full disk strikes while a new version is there to load: the
            # load fails and is retried once healed, the current version serving meanwhile.
            if disk is not None and fault == "disk_full":
                disk.fill()
            step += 1
            version = step
            tables = {k: TableData(t.keys, (t.values * (1 + 0.001 * step)).astype(np.float32)) for k, t in tables.items()}
            version_dir = write_checkpoint(demo.checkpoint_dir, tables, global_step=step)
            reference(str(version), 0, version_dir)
            if bucket is not None and fault != "full":
                bucket.proxy.mode = fault.removeprefix("store_").replace("truncated", "truncate")
            publish(version_dir)
            if fault != "full":  # healed after a while
                time.sleep(min(2.0, every / 2))
                if bucket is not None:
                    bucket.proxy.mode = "pass"
                if disk is not None:
                    disk.empty()
        elif fault == "kill_worker":
            # One of the live workers, while the other serves (a replacement may still be starting).
            workers_now = [w for z in process_tree(server.pid)[1:2] for w in process_tree(z)[1:]]
            if len(workers_now) >= 2:
                os.kill(workers_now[n % len(workers_now)], signal.SIGKILL)
                killed += 1
        elif fault == "redis_restart" and redis_server is not None:
            redis_server.kill()
            time.sleep(1.0)
            redis_server.start()  # empty: every version's rows must be imported again
            # The outage lasts until every process answers again (the version re-imported,
            # each process's Redis backoff over): its failures are the outage's.
            recoveries.append(_answering_again(url, bodies[0]))
        elif fault == "deleted_mid_load":
            # Newer than what serves, gone 50 ms after it appears: loaded in time, it serves
            # (from memory) until the next version; caught mid-load, the load fails.
            step += 1
            doomed = write_checkpoint(root / "stage", tables, global_step=step, name=f"doomed{n}")
            reference(f"doomed{n}", 0, doomed)
            target = demo.checkpoint_dir / f"doomed{n}"
            os.rename(doomed, target)
            publish(target)
            time.sleep(0.05)
            shutil.rmtree(target, ignore_errors=True)
            if bucket is not None:
                bucket.delete(f"ckpt/{target.name}")
        elif fault == "corrupt":
            bad = write_checkpoint(root / "stage", tables, global_step=step + 2000, name=f"bad{n}")
            table = next(bad.glob("embedding/*.safetensors"))
            data = bytearray(table.read_bytes())
            data[-5] ^= 0xFF
            table.write_bytes(bytes(data))
            os.rename(bad, demo.checkpoint_dir / f"bad{n}")
            publish(demo.checkpoint_dir / f"bad{n}")
    phases.append((time.monotonic(), "end"))
    # The end's resources with the tree whole again (a worker killed near the end restarts).
    _wait_whole(server.pid, start_stats["processes"])
    time.sleep(2)
    # Under load, as the start's and the first turn's: the same conditions compared.
    end_stats = _tree_stats(server.pid)
    stop.set()
    results = []
    for _ in clients:
        while True:
            chunk = out.get(timeout=60)
            results.extend(chunk)
            if len(chunk) < 200:
                break
    for c in clients:
        c.join(30)
    idle_stats = _tree_stats(server.pid)
    server.send_signal(signal.SIGTERM)
    code = server.wait(60)
    log.close()
    proxied = dict(bucket.proxy.served) if bucket is not None else {}
    for fixture in (bucket, disk):
        if fixture is not None:
            fixture.close()
    if redis_server is not None:
        redis_server.stop()
    # Every worker exit the log reports, beyond the soak's own kills, is a crash it found.
    exits = (root / "server.log").read_text(errors="replace").count(") exited (")

    def phase_of(t: float) -> str:
        name = "warmup"
        for at, p in phases:
            if at <= t:
                name = p
        return name

    def later_states(claim: tuple[str, str]) -> list[tuple[str, str]]:
        return [k for k in expected if k[0] == claim[0] and int(k[1]) >= int(claim[1])]

    sent, failed, wrong, unknown, outside = len(results), 0, 0, 0, 0
    failures: dict[tuple[str, str, str], int] = defaultdict(int)
    wrong_by: dict[str, int] = defaultdict(int)
    outside_by: dict[str, int] = defaultdict(int)
    latency: dict[str, list[float]] = defaultdict(list)
    for started, seconds, kind, index, ok, claim, value in results:
        latency[phase_of(started)].append(seconds)
        if not ok:
            failed += 1
            # By when it ended: a request in flight when a worker was killed fails then.
            phase = phase_of(started + seconds)
            failures[(kind, phase, claim[0] or "status != 200")] += 1
            if phase not in OUTAGES:
                outside += 1
                outside_by[f"{kind} during {phase}: {claim[0]}: {claim[1]}"] += 1
            continue
        states = later_states(claim)
        if not states:
            unknown += 1  # a state the soak did not compute: a bug, or a claim it cannot read
            if unknown <= 5:
                print(f"unattributed claim at {started - phases[0][0]:.3f} s:", kind, claim, "known states:", sorted(expected), file=sys.stderr)
            continue
        got = np.frombuffer(value, np.float32)
        if not any(got.shape == expected[s][index].ravel().shape
                   and np.allclose(got, expected[s][index].ravel(), atol=REFERENCE_ATOL, rtol=0) for s in states):
            wrong += 1
            wrong_by[f"{kind} during {phase_of(started)}: claimed {claim[0]}/{claim[1]}"] += 1
            if wrong <= 5:  # what a failed run must show: the answer beside each state's
                print(f"wrong answer at {started - phases[0][0]:.3f} s, {kind} request {index} claiming {claim}: got {got.tolist()},"
                      f" expected one of {[(s, expected[s][index].ravel().tolist()) for s in states]}", file=sys.stderr)
    per_phase = {p: {"requests": len(v), "p50_ms": round(float(np.percentile(v, 50)) * 1e3, 2),
                     "p99_ms": round(float(np.percentile(v, 99)) * 1e3, 2)} for p, v in sorted(latency.items())}
    updates = [p for p in per_phase if p not in ("warmup", "steady", "end", *OUTAGES)]
    worst = max(updates, key=lambda p: per_phase[p]["p99_ms"], default=None)
    report = {"minutes": minutes, "workers": workers, "tables": tables_in, "sent": sent, "failed": failed,
              "failed_outside_outages": outside, "wrong": wrong, "unattributed": unknown,
              "worker_exits": exits, "workers_killed": killed,
              "redis_recovery_seconds_max": round(max(recoveries), 2) if recoveries else None,
              "p99_worst_update_phase_vs_steady": None if worst is None or "steady" not in per_phase else
              f"{worst}: {per_phase[worst]['p99_ms'] / per_phase['steady']['p99_ms']:.2f}",
              "skipped": disk.reason if disk is not None and not disk.mounted else "", "failed_by": {f"{k} during {p}: {why}": v for (k, p, why), v in sorted(failures.items())},
              "wrong_by": dict(sorted(wrong_by.items())), "failed_outside_outages_by": dict(sorted(outside_by.items())),
              "faults": n, "store": store, "store_requests_by_mode": proxied, "exit_code": code, "start": start_stats,
              "after_first_turn": turn_stats, "end": end_stats, "after_load": idle_stats,
              "phases": per_phase, "log": str(root / "server.log")}
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--every", type=float, default=3.0, help="seconds between faults")
    parser.add_argument("--store", choices=("local", "s3"), default="local",
                        help="where versions live: a local directory, or S3 (moto) behind a fault proxy")
    parser.add_argument("--tables", choices=("memory", "redis", "tiered"), default="memory",
                        help="where tables live: memory, a redis-server killed in turn, or DRAM + SSD "
                             "tiers on a small tmpfs filled in turn (one process)")
    parser.add_argument("--faults", default="", help="comma-separated: only these of the turn's slots "
                        f"({', '.join(SLOTS)}); default every one the store and tables allow")
    args = parser.parse_args(argv)
    only = frozenset(f for f in args.faults.split(",") if f)
    if only - set(SLOTS):
        parser.error(f"unknown --faults {', '.join(sorted(only - set(SLOTS)))}; choose from {', '.join(SLOTS)}")
    report = soak(args.minutes, args.workers, args.every, args.store, args.tables, only)
    print(json.dumps(report, indent=2))
    clean = report["wrong"] == 0 and report["exit_code"] == 0 and report["worker_exits"] == report["workers_killed"]
    return 0 if clean else 1
