"""One point's figures from the clients' samples, and the run's table and JSON.

A point is one (batch, concurrency) pair. Rates count the answers completed inside the
measured window; latency percentiles are over every measured answer, failed ones
included (a fast 503 is still an answer the user waited for) — `errors` says how many.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from recserve.perf.client_process import Samples

__all__ = ["CLIENT_SATURATED", "PointResult", "summarize", "table"]

# A client process busy this fraction of one core or more was (near) the bottleneck.
CLIENT_SATURATED = 0.9
PERCENTILES = (50.0, 90.0, 99.0, 99.9)
CDF_POINTS = 200


@dataclass
class PointResult:
    batch: int
    concurrency: int
    duration_s: float
    requests: int
    requests_per_s: float
    rows_per_s: float
    latency_ms: dict[str, float]              # p50, p90, p99, p99.9, mean, max
    errors: dict[str, int]                    # failed answers by status
    client_processes: int
    client_cpu: float                         # busiest client process: CPU seconds / wall seconds
    client_saturated: bool
    server_stages_ms: dict[str, float] | None = None   # mean per request, from the server's /metrics
    cdf: list[tuple[float, float]] = field(default_factory=list)        # (latency ms, fraction <=)
    timeline: list[dict[str, float]] = field(default_factory=list)      # per interval: t, req/s, p99 ms
    first_error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _timeline(done: np.ndarray, latency: np.ndarray, duration: float) -> list[dict[str, float]]:
    step = 1.0 if duration >= 10 else max(duration / 10, 0.1)
    out = []
    for start in np.arange(0.0, duration - 1e-9, step):
        inside = (done >= start) & (done < start + step)
        lat = latency[inside]
        out.append({"t": round(float(start + step), 3), "requests_per_s": float(inside.sum() / step),
                    "p99_ms": float(np.percentile(lat, 99) * 1e3) if lat.size else float("nan")})
    return out


def _cdf(latency: np.ndarray) -> list[tuple[float, float]]:
    if latency.size == 0:
        return []
    fractions = np.linspace(0.0, 1.0, CDF_POINTS + 1)[1:]
    values = np.quantile(latency, fractions) * 1e3
    return [(round(float(v), 4), round(float(f), 4)) for v, f in zip(values, fractions)]


def summarize(samples: Sequence[Samples], batch: int, concurrency: int, duration: float) -> PointResult:
    done = np.concatenate([s.done for s in samples]) if samples else np.zeros(0)
    latency = np.concatenate([s.latency for s in samples]) if samples else np.zeros(0)
    ok = np.concatenate([s.ok for s in samples]) if samples else np.zeros(0, dtype=bool)
    statuses: Counter[str] = Counter()
    for s in samples:
        statuses.update(s.statuses)
    good = int(ok.sum())
    stats = {"mean": float(latency.mean() * 1e3), "max": float(latency.max() * 1e3)} if latency.size else {}
    for p in PERCENTILES:
        stats[f"p{p:g}"] = float(np.percentile(latency, p) * 1e3) if latency.size else float("nan")
    cpu = max((s.cpu_seconds / s.wall_seconds for s in samples if s.wall_seconds > 0), default=0.0)
    errors = {status: n for status, n in sorted(statuses.items()) if status not in ("200", "OK")}
    return PointResult(
        batch=batch, concurrency=concurrency, duration_s=duration, requests=int(latency.size),
        requests_per_s=latency.size / duration, rows_per_s=good * batch / duration, latency_ms=stats,
        errors=errors, client_processes=len(samples), client_cpu=round(cpu, 3),
        client_saturated=cpu >= CLIENT_SATURATED, cdf=_cdf(latency), timeline=_timeline(done, latency, duration),
        first_error=next((s.first_error for s in samples if s.first_error), ""),
    )


def _stages(stages: Mapping[str, float] | None) -> str:
    if not stages:
        return "-"
    return " ".join(f"{k} {v:.2f}" for k, v in stages.items())


def table(points: Sequence[PointResult]) -> str:
    """The plain table printed at the end of a run."""
    head = ("batch", "conc", "req/s", "rows/s", "p50 ms", "p90 ms", "p99 ms", "p99.9 ms", "errors",
            "client cpu", "server stages ms/req")
    rows = [head]
    for p in points:
        lat = p.latency_ms
        errors = ",".join(f"{k}:{v}" for k, v in p.errors.items()) or "0"
        rows.append((str(p.batch), str(p.concurrency), f"{p.requests_per_s:,.0f}", f"{p.rows_per_s:,.0f}",
                     *(f"{lat.get(k, float('nan')):.2f}" for k in ("p50", "p90", "p99", "p99.9")), errors,
                     f"{p.client_cpu:.0%}" + (" SATURATED" if p.client_saturated else ""), _stages(p.server_stages_ms)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i < 8 else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
