"""ONNX Runtime is an extra (recserve[cpu] / recserve[gpu]): without it, the user is told
which to install, not shown a bare ModuleNotFoundError. The interpreter runs with a module
on its path that fails as a missing onnxruntime does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HINT = "pip install 'recserve[cpu]' (or 'recserve[gpu]' for onnxruntime-gpu)"


def _without_onnxruntime(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "onnxruntime.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'onnxruntime'\", name='onnxruntime')\n")
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
                          env={"PYTHONPATH": f"{tmp_path}:{repo}", "PATH": "/usr/bin:/bin"})


def test_the_processor_names_the_extra_to_install(tmp_path: Path) -> None:
    done = _without_onnxruntime(tmp_path, "-c", "from recserve import Processor")
    assert done.returncode == 1
    assert f"recserve needs ONNX Runtime, which is not installed: {HINT}" in done.stderr


def test_the_command_line_says_it_in_one_line(tmp_path: Path) -> None:
    done = _without_onnxruntime(tmp_path, "-m", "recserve.server.cli", "serve", "--config", "config.json")
    assert done.returncode == 2
    assert done.stderr.strip() == f"recserve: recserve needs ONNX Runtime, which is not installed: {HINT}"
