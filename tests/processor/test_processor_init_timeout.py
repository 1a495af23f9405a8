"""init_timeout_minutes: minutes in the config, seconds in the wait for a first version.

The updater's clock runs 1000 times faster here (60 s of it pass in 60 ms), so the real
wait loop runs to its deadline without the test waiting a minute."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from recserve import Processor
from recserve.errors import ModelLoadError
from recserve.export.demo import write_demo
from recserve.model_store.updater import ModelUpdater


@pytest.fixture
def fast_clock(monkeypatch: pytest.MonkeyPatch) -> list[float | None]:
    """The timeouts load_initial was given; its clock 1000 times faster than the wall's."""
    timeouts: list[float | None] = []
    original = ModelUpdater.load_initial

    def load_initial(self: ModelUpdater, timeout: float | None) -> None:
        timeouts.append(timeout)
        started = time.monotonic()
        self._clock = lambda: started + (time.monotonic() - started) * 1000
        original(self, timeout)

    monkeypatch.setattr(ModelUpdater, "load_initial", load_initial)
    return timeouts


def _config(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    demo = write_demo(tmp_path / "demo")
    empty = tmp_path / "no-versions"
    empty.mkdir()
    return {**demo.config(), "checkpoint_dir": str(empty), "model_update_interval_seconds": 0.01, **fields}


def test_minutes_become_seconds_of_waiting_for_a_first_version(tmp_path: Path, fast_clock: list[float | None]) -> None:
    started = time.monotonic()
    with pytest.raises(ModelLoadError, match=r"no complete version appeared in .*no-versions within 120 s"):
        Processor(_config(tmp_path, init_timeout_minutes=2))
    assert fast_clock == [120.0]
    assert time.monotonic() - started < 60  # the fast clock's 120 s, not the wall's


def test_minus_one_waits_without_limit(tmp_path: Path, fast_clock: list[float | None]) -> None:
    config = _config(tmp_path)
    assert "init_timeout_minutes" not in config  # DeepRec's default, -1
    demo_versions = Path(config["savedmodel_dir"]).parent / "checkpoints"
    processor = Processor({**config, "checkpoint_dir": str(demo_versions)})
    try:
        assert fast_clock == [None] and processor.model_info()["version"] == "1"
    finally:
        processor.close()
