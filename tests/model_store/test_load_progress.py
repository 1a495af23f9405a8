"""Progress of a version's load (recserve.model_store.load_progress): bytes verified and
tables built, the periodic log line, and what model_info() shows."""

from __future__ import annotations

import logging

import pytest

from recserve import Processor
from recserve.model_store.load_progress import LoadProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_load_reports_percent_rate_and_eta_and_logs_every_few_seconds(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    progress = LoadProgress("m", log_every=5.0, clock=clock)
    assert progress.snapshot() is None and progress.fraction == 1.0
    progress.begin("version 7", 4 << 30)
    with caplog.at_level(logging.INFO, logger="recserve.model_store"):
        clock.now = 1.0
        progress.advance(1 << 30)  # before the first 5 s: no line
        clock.now = 6.0
        progress.advance(1 << 30)
    assert [r.getMessage() for r in caplog.records] == [
        "model 'm': loading version 7: 50% (2.00 of 4.00 GiB of checksums and tables), 341 MiB/s, ETA 6 s"]
    snap = progress.snapshot()
    assert snap == {"loading": "version 7", "percent": 50.0, "bytes_done": 2 << 30, "bytes_total": 4 << 30,
                     "rate_mib_s": 341.3, "eta_seconds": 6.0}
    progress.end()
    assert progress.snapshot() is None and progress.fraction == 1.0


class Recording(LoadProgress):
    def __init__(self) -> None:
        super().__init__("default")
        self.seen: list[tuple[str, int, int]] = []

    def begin(self, what: str, total: int) -> None:
        super().begin(what, total)
        self.seen.append(("begin", 0, total))

    def advance(self, done: int) -> None:
        super().advance(done)
        snap = self.snapshot()
        assert snap is not None
        self.seen.append(("advance", snap["bytes_done"], snap["bytes_total"]))


def test_a_processor_counts_every_file_checksum_and_every_table_built(tiny) -> None:
    version = tiny.write_full(1, tag=10, w=1)
    files = {p.relative_to(version).as_posix(): p.stat().st_size
             for p in version.rglob("*.safetensors")}
    progress = Recording()
    processor = Processor(tiny.config(), progress=progress)
    try:
        assert progress.seen[0] == ("begin", 0, 2 * sum(files.values()))
        done = [d for kind, d, _ in progress.seen if kind == "advance"]
        assert done == sorted(done)  # never goes back
        # checksums of every file, then the one table's build (dense parameters are not a table)
        assert done[-1] == 2 * sum(files.values()) - files["dense.safetensors"]
        assert processor.model_info()["load"] is None  # the load ended
    finally:
        processor.close()
