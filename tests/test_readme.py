"""The README carries the docs/ sections (config table, C ABI, server, ...) verbatim."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_readme_includes_are_in_sync() -> None:
    run = subprocess.run([sys.executable, "docs/include.py", "--check"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr


def test_readme_names_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "make serve" in text and "make test" in text
    assert "<!-- include docs/config.md -->" in text
