"""The live progress line on a terminal (tqdm when installed, a plain carriage-return
line otherwise), and one summary line per point on any stream."""

from __future__ import annotations

import sys
from typing import Any, TextIO

__all__ = ["Progress"]


class Progress:
    """Not thread-safe: the run's main thread drives it."""

    def __init__(self, stream: TextIO = sys.stderr) -> None:
        self._stream = stream
        self._live = stream.isatty()
        self._bar: Any = None
        self._label = ""
        self._duration = 0.0

    def start(self, label: str, duration: float) -> None:
        self._label, self._duration = label, duration
        if not self._live:
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=round(duration, 1), desc=label, unit="s", file=self._stream, leave=False,
                         bar_format="{desc} {bar} {n:.1f}/{total:.1f}s {postfix}")

    def update(self, seconds: float, answers: int) -> None:
        rate = answers / seconds if seconds > 0 else 0.0
        if self._bar is not None:
            self._bar.n = round(seconds, 1)
            self._bar.set_postfix_str(f"{answers:,} answers, {rate:,.0f} req/s")
        elif self._live:
            self._stream.write(f"\r{self._label}: {seconds:4.1f}/{self._duration:.1f}s {rate:,.0f} req/s   ")
            self._stream.flush()

    def finish(self, line: str) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._live:
            self._stream.write("\r" + " " * 70 + "\r")
        self._stream.write(line + "\n")
        self._stream.flush()
