"""PNG charts of a run (matplotlib, the optional extra `recserve[perf]`): throughput vs
concurrency, latency CDFs, throughput vs batch, and p99 over time with marked events.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from recserve.errors import RecserveError
from recserve.perf.results import PointResult

__all__ = ["plot_latency_cdf", "plot_run", "plot_throughput_vs_batch", "plot_timeline"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise RecserveError("--plot needs matplotlib: pip install 'recserve[perf]'") from None
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    return plt


def _save(plt: Any, fig: Any, path: str | os.PathLike[str]) -> None:
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise RecserveError(f"cannot write the plot {os.fspath(path)!r}: {exc.strerror or exc}") from None
    finally:
        plt.close(fig)


def _by_batch(points: Sequence[PointResult]) -> dict[int, list[PointResult]]:
    out: dict[int, list[PointResult]] = {}
    for p in points:
        out.setdefault(p.batch, []).append(p)
    return out


def _cdf_axes(ax: Any, points: Sequence[PointResult]) -> None:
    for p in points:
        if p.cdf:
            ax.plot([c[0] for c in p.cdf], [c[1] for c in p.cdf], label=f"batch {p.batch}, conc {p.concurrency}")
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms, log)")
    ax.set_ylabel("fraction of requests")
    ax.set_title("Latency CDF")
    ax.grid(True, which="both", alpha=0.3)
    if len(points) <= 12:
        ax.legend(fontsize=7)


def plot_run(points: Sequence[PointResult], path: str | os.PathLike[str], title: str = "") -> None:
    """Throughput and p99 vs concurrency (one line per batch size), and latency CDFs."""
    plt = _pyplot()
    fig, (tput, p99, cdf) = plt.subplots(1, 3, figsize=(15, 4.5))
    for batch, series in _by_batch(points).items():
        series = sorted(series, key=lambda p: p.concurrency)
        conc = [p.concurrency for p in series]
        tput.plot(conc, [p.requests_per_s for p in series], marker="o", label=f"batch {batch}")
        p99.plot(conc, [p.latency_ms.get("p99", float("nan")) for p in series], marker="o", label=f"batch {batch}")
    for ax, label, name in ((tput, "requests/s", "Throughput vs concurrency"), (p99, "p99 latency (ms)",
                                                                               "p99 vs concurrency")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (requests in flight)")
        ax.set_ylabel(label)
        ax.set_title(name)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    tput.set_ylim(bottom=0)
    _cdf_axes(cdf, points)
    if title:
        fig.suptitle(title)
    _save(plt, fig, path)


def plot_throughput_vs_batch(points: Sequence[PointResult], path: str | os.PathLike[str], title: str = "") -> None:
    """Requests/s and rows/s against rows per request, one line per concurrency."""
    plt = _pyplot()
    fig, (reqs, rows) = plt.subplots(1, 2, figsize=(11, 4.5))
    by_conc: dict[int, list[PointResult]] = {}
    for p in points:
        by_conc.setdefault(p.concurrency, []).append(p)
    for conc, series in sorted(by_conc.items()):
        series = sorted(series, key=lambda p: p.batch)
        batches = [p.batch for p in series]
        reqs.plot(batches, [p.requests_per_s for p in series], marker="o", label=f"conc {conc}")
        rows.plot(batches, [p.rows_per_s for p in series], marker="o", label=f"conc {conc}")
    for ax, label in ((reqs, "requests/s"), (rows, "rows/s")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch (rows per request)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title or "Throughput vs batch")
    _save(plt, fig, path)


def plot_latency_cdf(points: Sequence[PointResult], path: str | os.PathLike[str], title: str = "") -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    _cdf_axes(ax, points)
    if title:
        ax.set_title(title)
    _save(plt, fig, path)


def plot_timeline(point: PointResult, events: Sequence[tuple[float, str]], path: str | os.PathLike[str],
                  title: str = "") -> None:
    """p99 and requests/s per interval of one point, with vertical lines at `events`
    ((seconds into the window, label))."""
    plt = _pyplot()
    fig, p99 = plt.subplots(figsize=(10, 4.5))
    t = [x["t"] for x in point.timeline]
    p99.plot(t, [x["p99_ms"] for x in point.timeline], color="tab:red", marker=".", label="p99 (ms)")
    p99.set_xlabel("seconds")
    p99.set_ylabel("p99 latency per interval (ms)", color="tab:red")
    p99.set_ylim(bottom=0)
    rate = p99.twinx()
    rate.plot(t, [x["requests_per_s"] for x in point.timeline], color="tab:blue", alpha=0.6, label="requests/s")
    rate.set_ylabel("requests/s", color="tab:blue")
    rate.set_ylim(bottom=0)
    for at, label in events:
        p99.axvline(at, color="gray", linestyle="--")
        p99.annotate(label, (at, 0), xytext=(3, 5), textcoords="offset points", rotation=90, fontsize=8,
                     va="bottom")
    p99.grid(True, alpha=0.3)
    p99.set_title(title or f"p99 over time, batch {point.batch}, concurrency {point.concurrency}")
    _save(plt, fig, path)
