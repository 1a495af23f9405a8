"""The image test runs only from `make image-test` (RECSERVE_IMAGE_TEST=1): it builds the
image with buildah and runs it with podman, minutes of work `make test` leaves to it."""

from __future__ import annotations

import os

import pytest

from tests.image.containers import REPORT

collect_ignore_glob = [] if os.environ.get("RECSERVE_IMAGE_TEST") == "1" else ["*.py"]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if REPORT:
        terminalreporter.section("image test measurements")
        for line in REPORT:
            terminalreporter.write_line(line)
