"""The chaos soak in miniature (benchmarks/soak.py; RELIABILITY.md has a long run): worker
processes under HTTP and gRPC load while deltas, full versions, a version deleted while it
loads, a corrupt version and a killed worker land; every answer matches the state it names."""

from __future__ import annotations

import os

import pytest

from benchmarks.soak import soak

pytestmark = pytest.mark.skipif(os.environ.get("RECSERVE_PURE_PYTHON") == "1",
                                reason="worker processes share tables through the native engine")


def test_soak_answers_stay_right_through_faults():
    report = soak(minutes=0.25, workers=2, every=1.5)
    assert report["faults"] >= 6, report  # each kind once at least
    assert report["wrong"] == 0 and report["unattributed"] == 0, report
    assert report["failed"] <= 0.01 * report["sent"], report
    assert report["exit_code"] == 0, report
    assert report["worker_exits"] == report["workers_killed"], report  # no worker died on its own
    assert report["end"]["processes"] >= 3, report
