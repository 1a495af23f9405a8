"""Mutated TF Serving PredictRequests against a real `recserve serve` (issue 27, RELIABILITY.md):

    python -m benchmarks.mutate_tfserving [--requests 100000] [--threads 4]

Starts the demo model's server, sends valid requests (tf.make_tensor_proto's forms and the
*_val forms, batch 1..64) with their inputs mutated (bytes flipped, inserted, deleted, cut;
dims, dtypes and value counts changed) to /tensorflow.serving.PredictionService/Predict,
and checks every answer is OK or INVALID_ARGUMENT (NOT_FOUND only where a mutation rewrote
the model spec), that the server never dies, and that its memory (Rss of its process tree,
after a first 5% of the requests) grows by at most 20 MiB. Prints one summary line and
exits 1 on any violation.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from benchmarks.load_tools import free_port, tree_memory, wait_ready
from recserve.errors import RequestError
from recserve.export.demo import write_demo
from recserve.wire import tfserving_codec as tfs

ROOT = Path(__file__).resolve().parent.parent
METHOD = "/tensorflow.serving.PredictionService/Predict"
GROWTH_LIMIT = 20 << 20


def _val_form(inputs: dict[str, np.ndarray]) -> bytes:
    """The same request with every value in its *_val field (packed), strings as they are."""
    request = tfs.pb.PredictRequest()
    request.model_spec.name = "default"
    for name, value in inputs.items():
        proto = request.inputs[name]
        proto.dtype = tfs.tf_dtype("string" if value.dtype == object else str(value.dtype))
        for d in value.shape:
            proto.tensor_shape.dim.add(size=d)
        field = {np.float32: "float_val", np.int64: "int64_val"}.get(value.dtype.type, "string_val")
        getattr(proto, field).extend(value.reshape(-1).tolist())
    return request.SerializeToString()


def _mutate(rng: random.Random, data: bytes, keep: int) -> bytes:
    """`data` with its bytes after the model spec (the first `keep`) mutated."""
    head, body = data[:keep], bytearray(data[keep:])
    for _ in range(rng.randrange(1, 5)):
        what = rng.randrange(6)
        at = rng.randrange(len(body) + 1)
        if what == 0 and body:
            body[min(at, len(body) - 1)] ^= 1 << rng.randrange(8)
        elif what == 1:
            body[at:at] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 6)))
        elif what == 2:
            del body[at:at + rng.randrange(1, 16)]
        elif what == 3:
            body = body[:at]
        elif what == 4 and body:   # a varint-sized byte somewhere: dims, dtypes, lengths
            body[min(at, len(body) - 1)] = rng.choice([0, 1, 2, 7, 9, 10, 0x7F, 0x80, 0xFF])
        else:
            body += body[: rng.randrange(len(body) + 1)]   # repeated entries
    return head + bytes(body)


def _expected(data: bytes) -> set[str]:
    """The codes a correct server may answer: decoding decides INVALID_ARGUMENT, the
    model spec whether NOT_FOUND is allowed (a mutation may have rewritten it)."""
    try:
        request = tfs.decode_predict_request(data)
        request.decoded()
    except RequestError:
        return {"INVALID_ARGUMENT"}
    spec = request.spec
    allowed = {"OK", "INVALID_ARGUMENT"}
    if spec.name != "default" or spec.version not in (None, 1) or spec.version_label not in (None, "1"):
        allowed.add("NOT_FOUND")
    return allowed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="recserve-mutate-tfs-"))
    demo = write_demo(root / "demo")
    http_port, grpc_port = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "recserve.server.cli", "--log-level", "ERROR", "serve", "--config",
         str(demo.config_path), "--http-port", str(http_port), "--grpc-port", str(grpc_port)], cwd=ROOT)
    try:
        wait_ready(f"http://127.0.0.1:{http_port}/v2/health/ready", server, what="recserve serve")
        np_rng = np.random.default_rng(args.seed)
        seeds = []
        for batch in (1, 2, 8, 64):
            inputs = demo.sample_inputs(batch, np_rng)
            for data in (tfs.encode_predict_request(inputs, "default"), _val_form(inputs)):
                keep = len(tfs.encode_predict_request({}, "default"))
                seeds.append((data, keep))
        codes: collections.Counter[str] = collections.Counter()
        wrong: list[tuple[str, str, str]] = []
        lock = threading.Lock()
        per_thread = args.requests // args.threads
        baseline: list[int] = []
        start_gate = threading.Barrier(args.threads)

        def client(k: int) -> None:
            local = random.Random(args.seed * 1000 + k)
            with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
                call = channel.unary_unary(METHOD)
                start_gate.wait(60)
                for i in range(per_thread):
                    data, keep = local.choice(seeds)
                    mutated = _mutate(local, data, keep) if local.random() < 0.9 else data
                    try:
                        call(mutated, timeout=60)
                        code, details = "OK", ""
                    except grpc.RpcError as exc:
                        code, details = exc.code().name, exc.details() or ""
                    allowed = _expected(mutated)
                    with lock:
                        codes[code] += 1
                        if code not in allowed and len(wrong) < 20:
                            wrong.append((mutated.hex(), code, details))
                        if k == 0 and i == per_thread // 20:
                            baseline.append(tree_memory(server.pid)["Rss"])

        started = time.monotonic()
        threads = [threading.Thread(target=client, args=(k,)) for k in range(args.threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.monotonic() - started
        alive = server.poll() is None
        end = tree_memory(server.pid)["Rss"] if alive else 0
        growth = end - baseline[0] if baseline and alive else -1
        total = sum(codes.values())
        print(f"{total} mutated TF Serving PredictRequests in {seconds:.0f} s: codes {dict(codes)}; "
              f"server alive: {alive}; Rss {baseline[0] / 2**20 if baseline else 0:.1f} MiB after "
              f"{per_thread // 20 * args.threads} requests -> {end / 2**20:.1f} MiB at the end "
              f"(growth {growth / 2**20:.1f} MiB, limit {GROWTH_LIMIT >> 20} MiB); unexpected codes: {len(wrong)}")
        for item in wrong:
            print("  unexpected:", item)
        return 0 if alive and not wrong and 0 <= growth <= GROWTH_LIMIT and total == per_thread * args.threads else 1
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(60)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
