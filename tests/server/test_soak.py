"""The chaos soak in miniature (benchmarks/soak.py; RELIABILITY.md has a long run): worker
processes under HTTP and gRPC load while deltas, full versions, a version deleted while it
loads, a corrupt version and a killed worker land; every answer matches the state it names."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.soak import soak

pytestmark = pytest.mark.skipif(os.environ.get("RECSERVE_PURE_PYTHON") == "1",
                                reason="worker processes share tables through the native engine")


def _show(report: dict) -> None:
    """Prints the report and the server log's warnings and errors, which pytest shows whole
    when the test fails (it cuts an assertion's message short; CI keeps no tmp dir)."""
    print(json.dumps(report, indent=1, default=str))
    try:
        with open(report["log"], errors="replace") as log:
            print("".join(line for line in log if " WARNING " in line or " ERROR " in line)[-20000:])
    except OSError as exc:
        print(f"(no server log: {exc})")


def test_soak_answers_stay_right_through_faults():
    report = soak(minutes=0.25, workers=2, every=1.5)
    _show(report)
    assert report["faults"] >= 6, report  # each kind once at least
    assert (report["wrong"], report["unattributed"]) == (0, 0), report["wrong_by"]
    # the failures by client, phase and kind first: pytest cuts a long report short
    assert report["failed"] <= 0.01 * report["sent"], (report["failed_by"], report["phases"], report)
    assert report["exit_code"] == 0, report
    assert report["worker_exits"] == report["workers_killed"], report  # no worker died on its own
    assert report["end"]["processes"] >= 3, report


def test_soak_with_redis_killed_answers_right_and_recovers() -> None:
    """Tables in a redis-server that is SIGKILLed and restarted empty, among the other
    faults: never a wrong answer (the version comes back with its deltas), failures only
    while Redis or a worker is down, every process answering again within 10 s."""
    report = soak(minutes=0.25, workers=2, every=1.5, tables_in="redis")
    _show(report)
    assert report["faults"] >= 8, report  # the turn reached the restart
    assert (report["wrong"], report["unattributed"]) == (0, 0), report["wrong_by"]
    assert report["failed_outside_outages"] == 0, report["failed_outside_outages_by"]
    assert report["redis_recovery_seconds_max"] is not None and report["redis_recovery_seconds_max"] < 10, report
    assert report["worker_exits"] == report["workers_killed"], report


def test_soak_names_the_slots_it_knows_when_asked_for_another(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.soak import main

    with pytest.raises(SystemExit) as exc:
        main(["--faults", "full,flood"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "unknown --faults flood; choose from delta, full, kill_worker" in err, err
