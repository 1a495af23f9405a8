"""A full version that would not fit in the memory the process may still use is not built:
the update is refused with reason "memory", the serving version keeps answering, and the next
poll tries again (recserve.model_store.memory_budget)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from recserve import Processor
from recserve.errors import ConfigError
from recserve.model_store.manifest import FileEntry, Manifest
from recserve.model_store.memory_budget import TABLE_FACTOR, available_memory, version_bytes

SHA = "0" * 64


def test_the_estimate_weighs_table_files_by_the_engine_overhead() -> None:
    manifest = Manifest("full", 1, {"embedding/a.safetensors": FileEntry(1000, SHA),
                                    "dense.safetensors": FileEntry(500, SHA)})
    assert version_bytes(manifest) == int(1000 * TABLE_FACTOR + 500)


def test_available_memory_is_the_smaller_of_the_cgroup_room_and_mem_available(tmp_path: Path) -> None:
    cgroup, meminfo = tmp_path / "cg", tmp_path / "meminfo"
    cgroup.mkdir()
    meminfo.write_text("MemTotal: 100 kB\nMemAvailable:   2000 kB\n")
    (cgroup / "memory.max").write_text("1000000\n")
    (cgroup / "memory.current").write_text("400000\n")
    assert available_memory({}, cgroup=cgroup, meminfo=meminfo) == 600_000
    (cgroup / "memory.max").write_text("max\n")  # no limit: the host's figure
    assert available_memory({}, cgroup=cgroup, meminfo=meminfo) == 2_048_000
    assert available_memory({"RECSERVE_AVAILABLE_MEMORY_BYTES": "77"}, cgroup=cgroup, meminfo=meminfo) == 77
    with pytest.raises(ConfigError, match="RECSERVE_AVAILABLE_MEMORY_BYTES must be a byte count"):
        available_memory({"RECSERVE_AVAILABLE_MEMORY_BYTES": "lots"})


def test_a_swap_that_does_not_fit_is_refused_and_retried(tiny, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny.write_full(1, tag=10, w=1)
    processor = Processor(tiny.config(model_update_interval_seconds=0.05))
    try:
        monkeypatch.setenv("RECSERVE_AVAILABLE_MEMORY_BYTES", "1000")  # far less than version 2 needs
        tiny.write_full(2, tag=20, w=2)
        deadline = time.monotonic() + 10
        while processor.model_info()["update_failures"]["memory"] < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        info = processor.model_info()
        assert info["update_failures"]["memory"] >= 2  # refused, then tried again at a later poll
        assert info["version"] == "1"
        assert "memory: version 2 needs an estimated" in info["last_error"]
        np.testing.assert_array_equal(processor.predict({"item_id": tiny.keys})["score"],
                                      tiny.expected(tiny.keys, 10, 1))
        monkeypatch.setenv("RECSERVE_AVAILABLE_MEMORY_BYTES", str(1 << 40))
        while processor.model_info()["version"] != "2" and time.monotonic() < deadline + 20:
            time.sleep(0.02)
        assert processor.model_info()["version"] == "2"
        np.testing.assert_array_equal(processor.predict({"item_id": tiny.keys})["score"],
                                      tiny.expected(tiny.keys, 20, 2))
    finally:
        processor.close()
