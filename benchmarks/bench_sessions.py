"""Session groups: memory with session_num, throughput with session_num and dynamic
batching, and the costs behind the defaults (spinning, prepacking, session policy).

Every figure comes from `SessionGroup` over a dense ONNX graph (no embedding lookups),
driven by client threads in this process; the configurations of a row take turns
(5 rounds of 1 s each) and each figure is the median of its rounds. Memory rows run in child processes so that each starts from a clean RSS.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from benchmarks.report import Row

NOTES = """Dense model for throughput rows: MLP 429-512-256-1 (Gemm+Relu), the dense half of the
benchmark DLRM; clients call `SessionGroup.run` directly, in threads of this process;
the configurations of a row take turns, 5 rounds of 1 s, median of the rounds. Memory rows: 4 MatMul layers 4096x4096 float32 (256 MiB of parameters),
RSS after creating the group and one run per session, in a fresh process per figure.
The policy rows mix batch sizes 1..256 (one request in ten is 256 rows), 3 clients, 2
sessions with 2 intra-op threads each, and report the p99 of the small requests: that is
where a small request stuck behind a big run on the same pool shows.

Which policy by default: MOD. Over five runs on this 2-core machine the p99 of small
requests did not favour RR or LEAST_BUSY consistently (ratios vs MOD from 0.75 to 1.74
for RR, 0.87 to 2.02 for LEAST_BUSY): with as many CPU cores as sessions there is little
to balance, and MOD keeps each RPC thread on one session, i.e. on one `cpusets` group and
its caches, with no shared counter on the request path. LEAST_BUSY is there for uneven
traffic on bigger machines (more clients than sessions, long runs among short ones),
where it keeps small requests off a busy session.

These figures were taken while other work shared the 2 cores (load average 6-8), and
only the memory and prepacking rows held from run to run. Over five runs: session_num 2
vs 1 gave 0.42 to 1.15; batching on vs off 0.51 to 1.03 in throughput but always a 3-8x
lower p99; spinning off used 0.35 to 0.96 of the CPU per request of spinning on, at a
p50 from equal to 1.7x higher. On this tiny MLP a run costs ~0.1 ms, about the cost of
the Python request path, so neither more sessions nor batching has much run time to win
back. Spinning stays off by default: it never saved CPU, and it takes cores from the
other sessions and the embedding engine.
"""

MLP = (429, 512, 256, 1)
BIG_DIM, BIG_LAYERS = 4096, 4


def _save(path: Path, graph: onnx.GraphProto) -> str:
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9), path)
    return str(path)


def mlp_model(path: Path) -> str:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i, (n_in, n_out) in enumerate(itertools.pairwise(MLP)):
        inits += [
            numpy_helper.from_array((rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32), f"W{i}"),
            numpy_helper.from_array(np.zeros(n_out, np.float32), f"b{i}"),
        ]
        nodes.append(helper.make_node("Gemm", [x, f"W{i}", f"b{i}"], [f"h{i}"]))
        x = f"h{i}"
        if i < len(MLP) - 2:
            nodes.append(helper.make_node("Relu", [x], [x + "r"]))
            x += "r"
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", MLP[0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", 1])], inits,
    )
    return _save(path, graph)


def big_model(path: Path) -> str:
    rng = np.random.default_rng(0)
    nodes, inits, x = [], [], "x"
    for i in range(BIG_LAYERS):
        inits.append(numpy_helper.from_array((rng.standard_normal((BIG_DIM, BIG_DIM)) / 64).astype(np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"W{i}"], [f"h{i}"]))
        x = f"h{i}"
    graph = helper.make_graph(
        nodes, "big", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", BIG_DIM])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["batch", BIG_DIM])], inits,
    )
    return _save(path, graph)


def _group(model: str, **fields: Any) -> Any:
    from recserve.config import parse_config
    from recserve.processor.session_group import SessionGroup

    fields.setdefault("use_per_session_threads", True)
    return SessionGroup(model, parse_config({"savedmodel_dir": "/bench", **fields}))


def drive(group: Any, clients: int, batch_sizes: list[int], seconds: float) -> dict[str, float]:
    """Requests/s, p50/p99 latency (ms) and process CPU seconds per request."""
    rng = np.random.default_rng(1)
    inputs = {b: rng.standard_normal((b, MLP[0])).astype(np.float32) for b in set(batch_sizes)}
    latencies: list[list[float]] = [[] for _ in range(clients)]
    small: list[list[float]] = [[] for _ in range(clients)]
    stop = time.monotonic() + seconds
    for b in inputs.values():
        group.run([group.outputs[0].name], {"x": b})

    def client(slot: int) -> None:
        k = slot
        while time.monotonic() < stop:
            x = inputs[batch_sizes[k % len(batch_sizes)]]
            start = time.perf_counter()
            group.run([group.outputs[0].name], {"x": x})
            latencies[slot].append(time.perf_counter() - start)
            if x.shape[0] <= 16:
                small[slot].append(latencies[slot][-1])
            k += 1

    cpu0, wall0 = os.times(), time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cpu1, wall = os.times(), time.monotonic() - wall0
    done = np.concatenate([np.array(lat) for lat in latencies])
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    return {
        "rps": len(done) / wall,
        "p50": float(np.percentile(done, 50) * 1e3),
        "p99": float(np.percentile(done, 99) * 1e3),
        "p99_small": float(np.percentile(np.concatenate([np.array(s) for s in small]), 99) * 1e3),
        "cpu_per_req": cpu / len(done),
    }


def alternate(groups: dict[str, Any], *, clients: int, batch_sizes: list[int], rounds: int = 5) -> dict[str, dict[str, float]]:
    """Each group driven in turn for `rounds` rounds of 1 s; the median of every figure.
    Alternating spreads the machine's other load evenly over the configurations."""
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in groups}
    for _ in range(rounds):
        for name, group in groups.items():
            runs[name].append(drive(group, clients, batch_sizes, seconds=1.0))
    for group in groups.values():
        group.close()
    return {name: {k: float(np.median([r[k] for r in rs])) for k in rs[0]} for name, rs in runs.items()}


MEMORY_CHILD = """
import json, sys
import numpy as np
from benchmarks.bench_sessions import _group
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096
group = _group(sys.argv[1], session_num=int(sys.argv[2]), prepack_weights=sys.argv[3] == "1")
x = np.ones((8, 4096), np.float32)
for i in range(group.session_count):
    group._run_on(i, [group.outputs[0].name], {"x": x})
print(json.dumps({"rss": rss()}))
"""


def memory_rss(model: str, sessions: int, prepack: bool) -> int:
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, model, str(sessions), "1" if prepack else "0"],
        capture_output=True, text=True, check=True, cwd=root,
    )
    return int(json.loads(out.stdout.strip().splitlines()[-1])["rss"])


def _mib(n: float) -> str:
    return f"{n / 2**20:.0f} MiB"


def run() -> list[Row]:
    rows: list[Row] = []
    print(f"   load average before the run: {os.getloadavg()[0]:.1f}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_sessions_") as tmp:
        big = big_model(Path(tmp) / "big.onnx")
        params = BIG_LAYERS * BIG_DIM * BIG_DIM * 4
        shared = memory_rss(big, 8, False) - memory_rss(big, 1, False)
        rows.append(Row(
            "RSS growth session_num 1 -> 8, 256 MiB model, shared weights (/ parameter bytes)",
            _mib(shared), f"parameters {_mib(params)}", shared / params, "<= 0.10", shared / params <= 0.10,
        ))
        copied = memory_rss(big, 8, True) - memory_rss(big, 1, True)
        rows.append(Row(
            "RSS growth session_num 1 -> 8 with prepack_weights true (/ parameter bytes)",
            _mib(copied), f"parameters {_mib(params)}", copied / params,
        ))

        mlp = mlp_model(Path(tmp) / "mlp.onnx")
        r = alternate(
            {
                "1": _group(mlp, session_num=1, prepack_weights=False),
                "2": _group(mlp, session_num=2, intra_op_parallelism_threads=1, prepack_weights=False),
            },
            clients=4, batch_sizes=[8],
        )
        rows.append(Row(
            "requests/s batch 8, 4 clients: session_num 2 (intra 1 each) vs 1 (intra default)",
            f"{r['2']['rps']:.0f} req/s", f"{r['1']['rps']:.0f} req/s", r["2"]["rps"] / r["1"]["rps"],
        ))

        r = alternate(
            {
                "off": _group(mlp, session_num=2, intra_op_parallelism_threads=1),
                "on": _group(mlp, session_num=2, intra_op_parallelism_threads=1, max_batch_size=64, batch_timeout_micros=500),
            },
            clients=16, batch_sizes=[1],
        )
        on, off = r["on"], r["off"]
        rows.append(Row(
            "requests/s batch 1, 16 clients: dynamic batching on (max 64, 500 us) vs off",
            f"{on['rps']:.0f} req/s (p99 {on['p99']:.2f} ms)", f"{off['rps']:.0f} req/s (p99 {off['p99']:.2f} ms)",
            on["rps"] / off["rps"],
        ))

        r = alternate(
            {
                "off": _group(mlp, session_num=1, intra_op_parallelism_threads=2),
                "on": _group(mlp, session_num=1, intra_op_parallelism_threads=2, allow_spinning=True),
            },
            clients=1, batch_sizes=[8],
        )
        rows.append(Row(
            "CPU s per request, batch 8, 1 client, intra 2: spinning off vs on (lower is better)",
            f"{r['off']['cpu_per_req'] * 1e6:.0f} us CPU, p50 {r['off']['p50']:.3f} ms",
            f"{r['on']['cpu_per_req'] * 1e6:.0f} us CPU, p50 {r['on']['p50']:.3f} ms",
            r["off"]["cpu_per_req"] / r["on"]["cpu_per_req"],
        ))

        r = alternate(
            {
                "shared": _group(mlp, session_num=1, intra_op_parallelism_threads=1, prepack_weights=False),
                "prepacked": _group(mlp, session_num=1, intra_op_parallelism_threads=1, prepack_weights=True),
            },
            clients=1, batch_sizes=[8],
        )
        rows.append(Row(
            "latency p50 batch 8: shared weights without prepacking vs prepacked copies (lower is better)",
            f"{r['shared']['p50']:.3f} ms", f"{r['prepacked']['p50']:.3f} ms", r["shared"]["p50"] / r["prepacked"]["p50"],
        ))

        mixed = [1, 2, 4, 8, 256, 1, 2, 4, 8, 16]
        tails = alternate(
            {
                policy: _group(mlp, session_num=2, intra_op_parallelism_threads=2, select_session_policy=policy)
                for policy in ("MOD", "RR", "LEAST_BUSY")
            },
            clients=3, batch_sizes=mixed,
        )
        for policy in ("RR", "LEAST_BUSY"):
            rows.append(Row(
                f"p99 of small requests (batch <= 16) among batch-256 ones, 3 clients, 2 sessions of "
                f"intra 2: {policy} vs MOD (lower is better)",
                f"{tails[policy]['p99_small']:.2f} ms", f"MOD {tails['MOD']['p99_small']:.2f} ms",
                tails[policy]["p99_small"] / tails["MOD"]["p99_small"],
            ))
    return rows
