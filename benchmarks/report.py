"""Rows of BENCHMARKS.md: every figure is a ratio against a baseline measured in the same run."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPORT = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


@dataclass(frozen=True)
class Row:
    name: str          # what was measured, e.g. "lookup+gather 26x512 ids, uniform"
    value: str         # the measured figure with its unit, e.g. "41.2 M ids/s"
    baseline: str      # the same-run baseline with its unit, e.g. "numpy.take 80.1 M ids/s"
    ratio: float       # value / baseline (or baseline / value for latencies: say so in `name`)
    goal: str = ""     # e.g. ">= 0.5"; empty when there is none
    met: bool | None = None

    def markdown(self) -> str:
        met = "" if self.met is None else ("yes" if self.met else "**no**")
        return f"| {self.name} | {self.value} | {self.baseline} | {self.ratio:.3f} | {self.goal} | {met} |"


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem_gib:.0f} GiB, Python {platform.python_version()}, {platform.system()} {platform.release()}"


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
        return out.stdout.strip() or "uncommitted"
    except OSError:
        return "unknown"


def section(module: str, rows: list[Row], command: str, notes: str = "") -> str:
    lines = [
        f"## {module}",
        "",
        f"Machine: {machine()}  ",
        f"Command: `{command}` at commit {_commit()}",
        "",
        "| measurement | value | baseline (same run) | ratio | goal | met |",
        "|---|---|---|---|---|---|",
        *(r.markdown() for r in rows),
    ]
    if notes:
        lines += ["", notes.strip()]
    return "\n".join(lines) + "\n"


HEADER = """# Benchmarks

Written by `make bench` (`python -m benchmarks [module ...]`); each section is replaced
when its module runs again. Ratios compare against a baseline measured in the same run
on the same machine, so they travel between machines better than raw figures do.

"""


def write_sections(sections: dict[str, str]) -> None:
    """Replace (or append) the given `## module` sections of BENCHMARKS.md, keeping the rest."""
    text = REPORT.read_text() if REPORT.exists() else HEADER
    for module, body in sections.items():
        pattern = re.compile(rf"^## {re.escape(module)}\n.*?(?=^## |\Z)", re.DOTALL | re.MULTILINE)
        if pattern.search(text):
            text = pattern.sub(lambda _m, body=body: body + "\n", text)
        else:
            text = text.rstrip("\n") + "\n\n" + body
    REPORT.write_text(text.rstrip("\n") + "\n")
