"""cpusets against the machine, ONNX Runtime's 1-based affinity strings, pinning the caller."""

from __future__ import annotations

import os
import threading

import pytest

from recserve.errors import ConfigError
from recserve.runtime.cpus import (
    available_cpus,
    check_cpusets,
    intra_op_affinities,
    pin_calling_thread,
)
from tests.threads import Threads


def test_groups_of_usable_cpus_pass() -> None:
    check_cpusets(((0, 1), (2, 3)), available=frozenset(range(4)))


def test_a_cpu_the_process_cannot_use_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as caught:
        check_cpusets(((0, 1), (2, 5, 6)), available=frozenset(range(4)))
    assert caught.value.message == (
        "cpusets group 1 (2,5-6) names CPU(s) 5-6 that this process cannot use; available CPUs are 0-3"
    )
    assert caught.value.field == "cpusets"


def test_the_real_machine_is_checked_by_default() -> None:
    missing = max(available_cpus()) + 1
    with pytest.raises(ConfigError, match=f"names CPU\\(s\\) {missing} that this process cannot use"):
        check_cpusets(((missing,),))


def test_affinities_are_one_based_with_one_entry_per_worker() -> None:
    # A pool of 4 threads has 3 workers (the caller is the 4th); CPU 0 is "1" to ONNX Runtime.
    assert intra_op_affinities((0, 1, 2, 3), 4) == "1-4;1-4;1-4"
    assert intra_op_affinities((4, 6, 7), 2) == "5,7-8"
    with pytest.raises(ValueError):
        intra_op_affinities((0,), 1)


def _allowed(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/status") as status:
        return next(line.split(":")[1].strip() for line in status if line.startswith("Cpus_allowed_list"))


def test_pinning_moves_only_the_calling_thread() -> None:
    seen: dict[str, str] = {}

    def body() -> None:
        pin_calling_thread([0])
        seen["pinned"] = _allowed(threading.get_native_id())

    Threads([body], "a thread pinning itself").join(timeout=60)
    assert seen["pinned"] == "0"
    assert set(os.sched_getaffinity(0)) == set(available_cpus())
