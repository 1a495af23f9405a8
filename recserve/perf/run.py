"""`recserve perf`: requests, a preflight, then each batch x concurrency point in turn
with the client pool, and the table, JSON and plot at the end."""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from recserve.errors import RecserveError
from recserve.perf.client_pool import ClientPool, default_processes
from recserve.perf.options import PerfOptions
from recserve.perf.payloads import Payload, build_payload
from recserve.perf.preflight import preflight
from recserve.perf.progress import Progress
from recserve.perf.results import PointResult, summarize, table
from recserve.perf.served_signature import fetch_signature
from recserve.perf.server_metrics import scrape, stage_means
from recserve.perf.traffic import Inputs, ZipfKeys, read_requests, resize_batch, synthesize_requests

__all__ = ["measure", "payloads_by_batch", "run_perf"]


def _group_by_rows(requests: Sequence[Inputs]) -> dict[int, list[Inputs]]:
    groups: dict[int, list[Inputs]] = {}
    for request in requests:
        rows = int(next(iter(request.values())).shape[0]) if request else 0
        groups.setdefault(rows, []).append(request)
    return dict(sorted(groups.items()))


def payloads_by_batch(options: PerfOptions) -> dict[int, list[Payload]]:
    """The requests each batch size sends, encoded for the protocol."""
    if options.requests_file is not None:
        requests = read_requests(options.requests_file)
        if options.batches is None:
            inputs = _group_by_rows(requests)
        else:
            inputs = {b: resize_batch(requests, b) for b in options.batches}
    else:
        signature = fetch_signature(options.protocol, options.url, options.model, options.timeout)
        keys = ZipfKeys(options.keys[0], options.keys[1], options.zipf)
        assert options.batches is not None
        inputs = {b: synthesize_requests(signature, b, options.distinct, keys, seed=b) for b in options.batches}
    return {b: [build_payload(options.protocol, options.url, options.model, x) for x in group]
            for b, group in inputs.items()}


def measure(options: PerfOptions, payloads: dict[int, list[Payload]], pool: ClientPool,
            progress: Progress | None = None, on_point: Callable[[PointResult], None] | None = None
            ) -> list[PointResult]:
    """Every batch x concurrency point of `options`, in that order."""
    grpc = options.protocol.endswith("grpc")
    metrics_url = options.metrics_url or (None if grpc else options.url)
    points = []
    for batch, group in payloads.items():
        wire = [(p.data, p.method) for p in group]
        for concurrency in options.concurrency:
            before = scrape(metrics_url, options.model) if metrics_url else None
            label = f"batch {batch}, concurrency {concurrency}"
            if progress is not None:
                progress.start(label, options.duration)
            samples = pool.run(options.url, grpc, wire, concurrency, options.duration, options.warmup,
                               options.timeout, progress.update if progress is not None else None)
            after = scrape(metrics_url, options.model) if before is not None and metrics_url else None
            point = summarize(samples, batch, concurrency, options.duration)
            point.server_stages_ms = stage_means(before, after)
            if progress is not None:
                lat = point.latency_ms
                errors = sum(point.errors.values())
                progress.finish(f"{label}: {point.requests_per_s:,.0f} req/s, {point.rows_per_s:,.0f} rows/s, "
                                f"p50 {lat['p50']:.2f} ms, p99 {lat['p99']:.2f} ms"
                                + (f", {errors} errors" if errors else ""))
            points.append(point)
            if on_point is not None:
                on_point(point)
    return points


def _report(options: PerfOptions, points: list[PointResult], processes: int) -> dict[str, Any]:
    return {
        "format": "recserve.perf/1",
        "target": {"url": options.url, "protocol": options.protocol, "model": options.model},
        "settings": {"duration_s": options.duration, "warmup_s": options.warmup,
                     "requests": options.requests_file or "synthesized", "keys": list(options.keys),
                     "zipf": options.zipf, "client_processes": processes, "client_cores": os.cpu_count()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "points": [p.to_json() for p in points],
    }


def run_perf(options: PerfOptions, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    """The whole command; returns its exit code (1 when no request of the run succeeded).
    Raises RecserveError (one line) when the target cannot be measured at all."""
    payloads = payloads_by_batch(options)
    preflight(options.protocol, options.url, next(iter(payloads.values()))[0], options.timeout)
    processes = options.processes or default_processes(max(options.concurrency))
    with ClientPool(processes) as pool:
        points = measure(options, payloads, pool, Progress(err))
    print(table(points), file=out)
    for p in points:
        if p.client_saturated:
            print(f"recserve perf: the client was saturated at batch {p.batch}, concurrency {p.concurrency} "
                  f"(a client process used {p.client_cpu:.0%} of a core): the server may do more; use "
                  "--processes or a client machine of its own", file=err)
    if options.json_path:
        try:
            with open(options.json_path, "w") as f:
                json.dump(_report(options, points, processes), f, indent=1)
        except OSError as exc:
            raise RecserveError(f"cannot write --json {options.json_path!r}: {exc.strerror or exc}") from None
    if options.plot_path:
        from recserve.perf.plot import plot_run

        plot_run(points, options.plot_path, f"{options.protocol} {options.url} ({options.model})")
    if not any(p.requests - sum(p.errors.values()) > 0 for p in points):
        first = next((p.first_error for p in points if p.first_error), "")
        print(f"recserve perf: no request succeeded{': ' + first if first else ''}", file=err)
        return 1
    return 0
