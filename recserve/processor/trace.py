"""Per-request spans (decode, lookup, run, encode) for metrics and timelines.

A `RequestTrace` is created by the caller (server, timeline writer) and passed to
`Processor.process`/`predict`; the processor records into it. Not thread-safe: one
trace belongs to one request.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["STAGES", "RequestTrace", "Span"]

STAGES = ("decode", "lookup", "run", "encode")


class Span(NamedTuple):
    stage: str
    start_ns: int   # time.perf_counter_ns() clock
    end_ns: int

    @property
    def seconds(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


@dataclass
class RequestTrace:
    spans: list[Span] = field(default_factory=list)
    batch_size: int = 0
    model_version: str = ""
    # The newest delta applied to that version before the request began (0: none). A delta is
    # applied in place, table by table: one running meanwhile may already see some of it.
    delta_step: int = 0
    # Set by the caller to have this request's run profiled by ONNX Runtime (timelines);
    # the session group then fills `ort_profile_path` with the Chrome-trace JSON file.
    want_ort_profile: bool = False
    ort_profile_path: str | None = None
    # How many requests shared this request's run (request merging); 1: it ran alone.
    merged_with: int = 1
    # Wall time this request spent in the native route's C call, the GIL released: work another
    # thread could overlap (the server's InlinePolicy sends long stretches of it to a worker).
    released_ns: int = 0

    def served_by(self) -> tuple[tuple[str, str], ...]:
        """Which version answered, as HTTP headers / gRPC trailing metadata (lower case, as
        gRPC wants its keys): the servable the request leased, not a separate read of "the
        current version", which a swap in between would make wrong."""
        return (("x-recserve-model-version", self.model_version), ("x-recserve-delta-step", str(self.delta_step)))

    @contextmanager
    def span(self, stage: str) -> Iterator[None]:
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            self.spans.append(Span(stage, start, time.perf_counter_ns()))

    def add(self, stage: str, start_ns: int) -> None:
        """Record `stage` as running from start_ns until now (cheaper than `span` on hot paths)."""
        self.spans.append(Span(stage, start_ns, time.perf_counter_ns()))

    def seconds(self, stage: str) -> float:
        return sum(s.seconds for s in self.spans if s.stage == stage)
