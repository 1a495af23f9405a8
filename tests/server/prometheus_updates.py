"""What the metrics recorders' tests compare with: requests recorded one by one through
prometheus_client's own children (as a worker pool recorded them before pool_flush), and
the requests they record."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

STAGES = ("decode", "lookup", "run", "encode")
# (seconds, CPU seconds, stage seconds, rows). Binary fractions: their sums are exact in any
# order, as threads and flushes add them.
CALLS = [(2 ** -13, 2 ** -14, (2 ** -16, 0.0, 2 ** -12, 0.25), 64), (1.0, 0.5, (0.0, 0.0, 0.0, 0.0), 0),
         (3.0, 0.0, (2.5, 2 ** -14, 1.0, 2 ** -10), 1), (0.0, 0.25, (0.0, 2 ** -13, 0.0, 0.0), 100)]


def observe_one_by_one(requests: Any, seconds: Any, cpu: Any, stage: Any, batch: Any,
                       calls: Sequence[tuple[float, float, Sequence[float], int]]) -> None:
    """Each of `calls` as model "m"'s 200 on route "eas": a counter inc or histogram
    observe per value (a stage that did not run and 0 rows are not observed)."""
    for took, spent, stage_seconds, rows in calls:
        requests.labels("m", "eas", "200").inc()
        seconds.labels("m", "eas").observe(took)
        cpu.labels("m", "eas").inc(spent)
        for name, value in zip(STAGES, stage_seconds):
            if value:
                stage.labels("m", name).observe(value)
        if rows:
            batch.labels("m").observe(rows)
