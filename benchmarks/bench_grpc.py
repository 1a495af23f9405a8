"""gRPC Predict: what recserve's server adds to a call beyond the Processor, against the floor
of any Python gRPC server (issue "every model on the fast path", goal 3): grpcio's sync server
answering fixed bytes, under the same client, in the same run. And TF Serving's Predict
against EAS's on the same server and model (issue 27: no more CPU beyond the Processor)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from benchmarks.load_tools import free_port, request_cpu_seconds, serve_process, tree_cpu_seconds, wait_ready
from benchmarks.report import Row
from recserve import Processor
from recserve.export.demo import write_demo
from recserve.perf.payloads import kserve_grpc_message
from recserve.server.runner import WORKERS
from recserve.wire.codec import encode_request
from recserve.wire.tfserving_codec import encode_predict_request

ROOT = Path(__file__).resolve().parent.parent
THREADS, SECONDS, ROUNDS = 4, 4.0, 3
TFS_ROUNDS = 4
METHOD = "/tensorflow.eas.PredictionService/Predict"
TFS_METHOD = "/tensorflow.serving.PredictionService/Predict"
KSERVE_METHOD = "/inference.GRPCInferenceService/ModelInfer"
NOTES = f"""Demo model (`recserve demo`). One client process of {THREADS} threads, each calling
`{METHOD}` with the same PredictRequest bytes (one channel, raw bytes, no client-side
parsing) for {SECONDS:.0f} s, against `recserve serve` and against a minimal grpcio sync server
(benchmarks/peers/grpc_fixed.py, {WORKERS} worker threads like recserve's) answering recserve's
own answer bytes; {ROUNDS} alternating rounds, the lower CPU per call of each kept. Server CPU per
call = user+system CPU of the server's process tree over the calls answered; in-process =
`Processor.process` CPU per call on the same bytes in the benchmark's process. Goal: (server -
in-process) <= 1.2x the floor's CPU per call. The row splits the server's CPU with
recserve_request_cpu_seconds_total into the native route's calls and the rest (the gRPC
front end: grpc++ and what it does around the route).

The gRPC front end (issue 25, 2026-11-26; recserve/server/grpc_front.py, native/grpc_front.cc):
grpc++ on the port answers EAS and TF Serving Predict on the native route with no Python
and forwards every other call to grpcio's servicers. Its rows: the same server started with
RECSERVE_GRPC_FRONT=0 (grpcio's servicer calling `Processor.process`, as before) in the same
rounds; KServe ModelInfer, which the front end forwards, against that server too (what a
forwarded call costs more: the extra hop through grpc++ on both sides of a Unix socket).
The refusal row's server batches dynamically, so its calls are forwarded and park grpcio's
threads, and the front end refuses the rest in C++. A forwarded call pays grpc++ twice more
(its server side and its client side; perf on a KServe batch-64 load: grpc++'s threads were
~39% of the server's CPU), ~100-400 us a call here: KServe gRPC ModelInfer, which has no
native route yet, costs that much more than with grpcio alone (RECSERVE_GRPC_FRONT=0 gives
it back, at the EAS and TF Serving Predicts' expense).

Before the front end (the paragraphs below; the Python servicer under grpcio): inside the
server the handler cost 3-4x `Processor.process` in the benchmark's own loop. The Processor runs cold there: its code and data leave the caches
between calls. In a loop of its own, on this machine, a batch-1 call took 126 us
back to back, 261-305 us with a 0.5 ms sleep between calls, and 402-427 us after touching
8 MB between calls; every stage grew alike. A grpc.aio server calling `Processor.process`
on its loop measured ~750 us per call against ~870 us for a sync one. With the same call on
an executor it measured ~1,160 us, and grpc.aio admits calls one per loop turn, so its
backlog waits inside gRPC where no admission control can count it.

TF Serving rows: the same client calls `{TFS_METHOD}` with the same inputs as
a tensorflow.serving.PredictRequest (as `tf.make_tensor_proto` writes them: numbers in
tensor_content, strings in string_val), alternating with EAS calls in the same rounds; each
side's server CPU per call minus `Processor.process` on the EAS bytes; goal: TF Serving's
<= EAS's. The row also gives each side's CPU inside the calls' handlers (the dispatcher's
thread CPU: parse, model, encode; grpcio's own work is outside it). The machine is shared
with other jobs (load average 9-15 from other agents during the recorded run): rounds
alternate so load hits both alike, the lowest of {TFS_ROUNDS} rounds is kept, and two runs
minutes apart differed by up to 15% in either direction.

TF Serving native-route rows (issue 24, item 4): TF Serving Predict answered by the native
route (`rs_route_process_tfs`) against a second server of the same model started with
RECSERVE_NATIVE_ROUTE=0, where it takes the Python route it took before (native parse,
`Processor.serve`, Python encode); the two alternate in the same rounds as the EAS calls,
lowest of {TFS_ROUNDS} rounds each; the load average is the row's at its end.

Refusal row: a server whose model has max_queued_requests 1 and a 60 s dynamic-batching
wait (max_batch_size 512), so the calls first sent park its worker threads and fill the
call limit (workers + queued + 64 for Health watches); then every call of the same client
is refused with RESOURCE_EXHAUSTED before it is read or reaches recserve's code: by grpcio's
own Python before the front end (123 us a refusal, 0.49x the floor), by the front end in
C++ now. Against the minimal grpcio server answering 64 fixed bytes (batch-1 request),
alternated, lower of {ROUNDS} rounds. The limit is the server's, not one model's: gRPC's
per-model admission is this sum (see docs/server.md, Admission).

Issue 25, earlier (two runs at commits d8d4754 and ebd86cb, load average 4-6): beyond
`Processor.process` EAS Predict cost 352 / 463 us against the floor's 260 / 332 us at batch 1
(1.35x / 1.40x) and 365 / 452 us against 296 / 288 us at batch 64 (1.23x / 1.57x).

Issue 25, where the rest goes (2026-11-26, four runs of this section within an hour, the
last one recorded above after merging main, load average 2-15 from other agents): the third
server in the rounds (benchmarks/peers/grpc_processor.py) is grpcio's sync server whose handler only
calls `Processor.process` and sets the same trailing metadata. Beyond the in-process
`Processor.process` it cost 1.16-1.40x the floor at batch 1 and 1.29-1.51x at batch 64, and
recserve 1.05-1.19x of it (recserve 1.38-1.51x the floor at batch 1, 1.35-1.60x at batch 64).
So most of what recserve adds beyond the floor is `Processor.process` running in grpcio's
worker threads (12 us in a loop, ~90 us more there: its code and data cold between calls,
threads handed the GIL), which any servicer calling it from grpcio's handler pays; the
servicer's own work (model lookup, lease, metrics, deadline, warmup recording: ~10-13 us a
call in a loop; the last two runs with the per-request metrics recorded in one call,
local_metrics.RequestRecorder, ~3 us less) is the 5-19% above it (9-11% in the run above). Tried,
measured the same way, interleaved, batch 1: the native route's call with the GIL kept
(ctypes.PyDLL, an experiment) 1.42x the floor against 1.30x releasing it; a grpc.aio server
calling `Processor.process` on its uvloop event loop 343 us a call against the sync floor's
256 us (1.29x beyond in-process, as the sync grpc_processor's), 390 us on asyncio's own loop;
on the floor, the options recserve's server sets (maximum_concurrent_rpcs, the trailing
metadata, reading invocation_metadata and time_remaining, registered method handlers) each
moved its CPU per call by less than run-to-run noise (213-240 us against 217 us). Not met:
`Processor.process` alone inside grpcio's sync server costs about the goal or more
(1.16-1.51x the floor in these runs; the aio server no less); what is left is the
Processor's own cost in those threads (the native route, outside this issue's files),
grpcio's per-call Python, and the servicer's ~10 us.

A gRPC front end without Python, tried (2026-11-26, load 2.3-2.8): benchmarks/peers/grpcxx_fixed.cc,
grpc++ 1.51 (Debian's libgrpc++-dev) with a callback generic service answering the same
fixed bytes, alternated with grpc_fixed.py under this benchmark's client (`_calls`, 4
threads, 3 rounds): 97-106 us of server CPU a call against grpcio's 268-319 us (0.35x), at
18,400-21,100 against 11,600-13,800 calls/s. A grpc++ server calling the native route
(rs_route_process: 16 us a batch-1 call here) would cost ~115 us a call where recserve's
servicer costs ~410. Built since: the front end rows above measure it (~110 us beyond
`Processor.process` at batch 1 and 64)."""


def _cpu_per_call(pid: int, target: str, payload: bytes, metrics: str | None = None,
                  method: str = METHOD) -> tuple[float, float]:
    """Server CPU seconds per call under THREADS client threads for SECONDS, and of it the
    seconds in the calls' handlers (recserve's metrics at base URL `metrics`; 0 without)."""
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method)
        for _ in range(200):
            call(payload, timeout=30)
        counts = [0] * THREADS
        stop = time.monotonic() + SECONDS

        def client(k: int) -> None:
            while time.monotonic() < stop:
                call(payload, timeout=30)
                counts[k] += 1

        before, handled = tree_cpu_seconds(pid), request_cpu_seconds(metrics) if metrics else 0.0
        threads = [threading.Thread(target=client, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        calls = sum(counts)
        handler = (request_cpu_seconds(metrics) - handled) / calls if metrics else 0.0
        return (tree_cpu_seconds(pid) - before) / calls, handler


def _calls(target: str, payload: bytes) -> tuple[int, dict[str, int]]:
    """Calls made by THREADS client threads for SECONDS against `target`, by status code."""
    counts: list[dict[str, int]] = [{} for _ in range(THREADS)]
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(METHOD)
        stop = time.monotonic() + SECONDS

        def client(k: int) -> None:
            while time.monotonic() < stop:
                try:
                    call(payload, timeout=30)
                    code = "OK"
                except grpc.RpcError as exc:
                    code = exc.code().name
                counts[k][code] = counts[k].get(code, 0) + 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    total: dict[str, int] = {}
    for per_thread in counts:
        for code, n in per_thread.items():
            total[code] = total.get(code, 0) + n
    return sum(total.values()), total


def _refusal_cpu(root: Path, config: dict[str, object], body: bytes, answer: Path) -> Row:
    """Server CPU per RESOURCE_EXHAUSTED refusal, every call refused: the worker threads are
    parked in a 60 s dynamic-batching wait (a batching model's calls are forwarded to
    grpcio) and the call limit (workers + the model's max_queued_requests + Health's
    headroom) is taken by parked calls, so the gRPC front end refuses the rest; against a
    minimal grpcio server's CPU per answered call, alternated."""
    parked = config | {"max_batch_size": 512, "batch_timeout_micros": 60_000_000, "max_queued_requests": 1,
                       "max_queue_ms": 120_000}
    (root / "parked.json").write_text(json.dumps(parked))
    http_port, grpc_port, peer_port = free_port(), free_port(), free_port()
    server = serve_process(root / "parked.json", http_port, grpc_port)
    peer = subprocess.Popen([sys.executable, "-m", "benchmarks.peers.grpc_fixed", str(peer_port), str(WORKERS),
                             str(answer)], cwd=ROOT, stdout=subprocess.PIPE)
    target = f"127.0.0.1:{grpc_port}"
    try:
        assert peer.stdout is not None and peer.stdout.readline().strip() == b"ready"
        wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", server, what="recserve serve")
        with grpc.insecure_channel(target) as channel:
            call = channel.unary_unary(METHOD)
            parked_calls = [call.future(body, timeout=120) for _ in range(WORKERS + 1 + 64 + 16)]
            deadline = time.monotonic() + 30
            while not any(f.done() for f in parked_calls):  # the limit is reached: the surplus is refused
                assert time.monotonic() < deadline, "no call was refused: the server's call limit was not reached"
                time.sleep(0.05)
            refused, floor = float("inf"), float("inf")
            for _ in range(ROUNDS):
                before = tree_cpu_seconds(server.pid)
                calls, codes = _calls(target, body)
                assert codes.keys() == {"RESOURCE_EXHAUSTED"}, codes
                refused = min(refused, (tree_cpu_seconds(server.pid) - before) / calls)
                before = tree_cpu_seconds(peer.pid)
                calls, codes = _calls(f"127.0.0.1:{peer_port}", body)
                floor = min(floor, (tree_cpu_seconds(peer.pid) - before) / calls)
            rate = calls / SECONDS
        return Row(
            f"gRPC Predict refused (RESOURCE_EXHAUSTED: workers parked, call limit taken), {THREADS} client threads: "
            f"server CPU per refusal / a minimal grpcio server's CPU per answered call (~{rate:,.0f} calls/s)",
            f"{refused * 1e6:.0f} us", f"grpcio floor {floor * 1e6:.0f} us", refused / floor, "", None)
    finally:
        server.kill()  # the parked calls would hold a graceful stop for their whole wait
        server.wait(30)
        peer.terminate()
        peer.wait(30)


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-grpc-"))
    demo = write_demo(root / "demo")
    http_port, grpc_port, peer_port, bare_port = free_port(), free_port(), free_port(), free_port()
    server = serve_process(demo.config_path, http_port, grpc_port)
    # The baseline of the TF Serving native-route rows: the same server on the Python route
    # (what TF Serving Predict took before it had a native entry).
    python_http, python_grpc = free_port(), free_port()
    python_server = serve_process(demo.config_path, python_http, python_grpc, env={"RECSERVE_NATIVE_ROUTE": "0"})
    # The gRPC front end's baseline: the same server with grpcio on the port (its servicer
    # calling Processor.process), as before the front end.
    grpcio_http, grpcio_grpc = free_port(), free_port()
    grpcio_server = serve_process(demo.config_path, grpcio_http, grpcio_grpc, env={"RECSERVE_GRPC_FRONT": "0"})
    peer = bare = None
    rows: list[Row] = []
    try:
        wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", server, what="recserve serve")
        wait_ready(f"http://127.0.0.1:{python_http}/v2/health/ready", python_server, what="recserve serve")
        wait_ready(f"http://127.0.0.1:{grpcio_http}/v2/health/ready", grpcio_server, what="recserve serve")
        processor = Processor(json.loads(demo.config_path.read_text()))
        for batch in (1, 64):
            body = encode_request(demo.sample_inputs(batch, np.random.default_rng(batch)))
            status, answer = processor.process(body)
            assert status == 200, answer
            (root / "answer.bin").write_bytes(answer)
            peer = subprocess.Popen([sys.executable, "-m", "benchmarks.peers.grpc_fixed", str(peer_port),
                                     str(WORKERS), str(root / "answer.bin")], cwd=ROOT, stdout=subprocess.PIPE)
            bare = subprocess.Popen([sys.executable, "-m", "benchmarks.peers.grpc_processor", str(bare_port),
                                     str(WORKERS), str(demo.config_path)], cwd=ROOT, stdout=subprocess.PIPE)
            for started in (peer, bare):
                assert started.stdout is not None and started.stdout.readline().strip() == b"ready"
            (ours, handler), floor, least = (float("inf"), 0.0), float("inf"), float("inf")
            (before, before_handler) = (float("inf"), 0.0)
            for _ in range(ROUNDS):
                ours, handler = min((ours, handler), _cpu_per_call(
                    server.pid, f"127.0.0.1:{grpc_port}", body, f"http://127.0.0.1:{http_port}"))
                floor = min(floor, _cpu_per_call(peer.pid, f"127.0.0.1:{peer_port}", body)[0])
                least = min(least, _cpu_per_call(bare.pid, f"127.0.0.1:{bare_port}", body)[0])
                before, before_handler = min((before, before_handler), _cpu_per_call(
                    grpcio_server.pid, f"127.0.0.1:{grpcio_grpc}", body, f"http://127.0.0.1:{grpcio_http}"))
            for started in (peer, bare):
                started.terminate()
                started.wait(30)
            peer = bare = None
            tfs_body = encode_predict_request(demo.sample_inputs(batch, np.random.default_rng(batch)), "default")
            eas, tfs = (float("inf"), float("inf")), (float("inf"), float("inf"))
            tfs_python = (float("inf"), float("inf"))
            kserve_body = kserve_grpc_message(demo.sample_inputs(batch, np.random.default_rng(batch)), "default")
            kserve, kserve_before = float("inf"), float("inf")
            for _ in range(TFS_ROUNDS):
                target, metrics = f"127.0.0.1:{grpc_port}", f"http://127.0.0.1:{http_port}"
                eas = min(eas, _cpu_per_call(server.pid, target, body, metrics))
                tfs = min(tfs, _cpu_per_call(server.pid, target, tfs_body, metrics, TFS_METHOD))
                tfs_python = min(tfs_python, _cpu_per_call(python_server.pid, f"127.0.0.1:{python_grpc}", tfs_body,
                                                           f"http://127.0.0.1:{python_http}", TFS_METHOD))
                kserve = min(kserve, _cpu_per_call(server.pid, target, kserve_body, method=KSERVE_METHOD)[0])
                kserve_before = min(kserve_before, _cpu_per_call(
                    grpcio_server.pid, f"127.0.0.1:{grpcio_grpc}", kserve_body, method=KSERVE_METHOD)[0])
            rows.append(Row(
                f"KServe gRPC ModelInfer batch {batch} (forwarded by the gRPC front end to grpcio's servicer), "
                f"{THREADS} client threads: server CPU per call / the same server without the front end "
                f"(RECSERVE_GRPC_FRONT=0), {TFS_ROUNDS} alternating rounds: what a forwarded call costs more",
                f"{kserve * 1e6:.0f} us", f"grpcio alone {kserve_before * 1e6:.0f} us", kserve / kserve_before,
                "", None))
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            rows.append(Row(
                f"TF Serving gRPC Predict batch {batch}, {THREADS} client threads: server CPU per call on the native "
                f"route / on the Python route (the same server with RECSERVE_NATIVE_ROUTE=0), {TFS_ROUNDS} "
                f"alternating rounds (in the calls' handlers: native {tfs[1] * 1e6:.0f} us, Python "
                f"{tfs_python[1] * 1e6:.0f} us; load average {load})",
                f"{tfs[0] * 1e6:.0f} us", f"Python route {tfs_python[0] * 1e6:.0f} us", tfs[0] / tfs_python[0],
                "< 1.0", tfs[0] < tfs_python[0]))
            started = time.process_time()
            for _ in range(3000):
                processor.process(body)
            inside = (time.process_time() - started) / 3000
            rows.append(Row(
                f"TF Serving gRPC Predict batch {batch}, {THREADS} client threads: server CPU per call minus "
                f"Processor.process ({inside * 1e6:.0f} us) / EAS gRPC Predict's, same server, {TFS_ROUNDS} "
                f"alternating rounds (in the calls' handlers: TF Serving {tfs[1] * 1e6:.0f} us, EAS "
                f"{eas[1] * 1e6:.0f} us)",
                f"{(tfs[0] - inside) * 1e6:.0f} us", f"EAS {(eas[0] - inside) * 1e6:.0f} us",
                (tfs[0] - inside) / (eas[0] - inside), "<= 1.0", tfs[0] <= eas[0]))
            added = ours - inside
            load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
            rows.append(Row(
                f"gRPC Predict batch {batch}, {THREADS} client threads: server CPU per call minus in-process "
                f"(server {ours * 1e6:.0f} us, Processor.process {inside * 1e6:.0f} us; of the server's CPU, "
                f"{handler * 1e6:.0f} us in the native route's call, {(ours - handler) * 1e6:.0f} us in the gRPC "
                f"front end around it; load average {load}) / a minimal grpcio server's CPU per call",
                f"{added * 1e6:.0f} us", f"grpcio floor {floor * 1e6:.0f} us", added / floor, "<= 1.2",
                added / floor <= 1.2))
            rows.append(Row(
                f"gRPC Predict batch {batch}, {THREADS} client threads: server CPU per call with the gRPC front end / "
                "without it (the same server with RECSERVE_GRPC_FRONT=0: grpcio's servicer; of its CPU, "
                f"{before_handler * 1e6:.0f} us in the calls' handlers; beyond Processor.process "
                f"{(before - inside) / floor:.2f}x the floor)",
                f"{ours * 1e6:.0f} us", f"grpcio servicer {before * 1e6:.0f} us", ours / before, "", None))
            rows.append(Row(
                f"gRPC Predict batch {batch}, {THREADS} client threads: server CPU per call minus in-process / the "
                "same of a minimal grpcio server calling Processor.process in its handler (benchmarks/peers/"
                f"grpc_processor.py: {least * 1e6:.0f} us a call, {(least - inside) / floor:.2f}x the floor)",
                f"{added * 1e6:.0f} us", f"grpcio + Processor {(least - inside) * 1e6:.0f} us",
                added / (least - inside), "", None))
        processor.close()
        small = root / "small_answer.bin"
        small.write_bytes(b"\0" * 64)
        rows.append(_refusal_cpu(root, json.loads(demo.config_path.read_text()),
                                 encode_request(demo.sample_inputs(1, np.random.default_rng(1))), small))
        return rows
    finally:
        for proc in (server, python_server, grpcio_server, peer, bare):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(30)
        shutil.rmtree(root, ignore_errors=True)
