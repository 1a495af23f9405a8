"""The server's own view of a point: its stage histograms (decode, lookup, run, encode)
and request latency, scraped from recserve's `/metrics` before and after the point.

A target that is not recserve (no `recserve_stage_seconds` family) or whose /metrics
cannot be read gives no breakdown; that is not an error.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections import defaultdict

__all__ = ["StageTotals", "scrape", "stage_means"]

# (stage, "sum" | "count") -> value, summed over the selected models
StageTotals = dict[tuple[str, str], float]
_FAMILIES = {"recserve_stage_seconds": "stage", "recserve_request_seconds": None}
_ORDER = ("decode", "lookup", "run", "encode", "server")


def scrape(metrics_url: str, model: str, timeout: float = 5.0) -> StageTotals | None:
    """Stage and server-total sums and counts of `model` (or of every model, when no
    model of that name is labelled), or None when there is nothing to read."""
    try:
        with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except (urllib.error.URLError, OSError, UnicodeDecodeError):
        return None
    totals: defaultdict[str, defaultdict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    found = False
    # Imported here: importing prometheus_client fixes its value storage for the process,
    # and `recserve serve --workers` must set PROMETHEUS_MULTIPROC_DIR first (the CLI builds
    # this module's parser before it knows the command).
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        if family.name not in _FAMILIES:
            continue
        found = found or family.name == "recserve_stage_seconds"
        for sample in family.samples:
            kind = sample.name.rsplit("_", 1)[-1]
            if kind not in ("sum", "count"):
                continue
            label = _FAMILIES[family.name]
            stage = sample.labels.get(label, "") if label else "server"
            totals[sample.labels.get("model", "")][(stage, kind)] += sample.value
    if not found:
        return None
    if model in totals:
        return dict(totals[model])
    merged: defaultdict[tuple[str, str], float] = defaultdict(float)
    for per_model in totals.values():
        for key, value in per_model.items():
            merged[key] += value
    return dict(merged)


def stage_means(before: StageTotals | None, after: StageTotals | None) -> dict[str, float] | None:
    """Mean milliseconds per request in each stage between two scrapes ("server": the
    whole request inside the server)."""
    if before is None or after is None:
        return None
    out = {}
    stages = sorted({stage for stage, _ in after}, key=lambda s: _ORDER.index(s) if s in _ORDER else len(_ORDER))
    for stage in stages:
        count = after.get((stage, "count"), 0.0) - before.get((stage, "count"), 0.0)
        if count > 0:
            spent = after.get((stage, "sum"), 0.0) - before.get((stage, "sum"), 0.0)
            out[stage] = round(spent / count * 1e3, 4)
    return out
