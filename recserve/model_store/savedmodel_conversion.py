"""Converting a SavedModel at load: in a subprocess, cached on disk (DESIGN §4c).

The cache key is sha256 over recserve's version, the signature name and every file of the
SavedModel dir (relative path and bytes): the same model converts once per host. The
cache lives in `$RECSERVE_CACHE_DIR` (default `~/.cache/recserve`), under `savedmodels/<key>`;
a conversion is written beside it and renamed into place, so a reader never sees half of one.
The serving process never imports TensorFlow: `python -m recserve.convert` does the work,
and checks it against TensorFlow on LOAD_CHECK_REQUESTS synthesized requests (refused above
1e-5, naming the worst one).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import recserve
from recserve.errors import ModelLoadError

__all__ = ["MISSING_EXTRA", "cache_root", "conversion_key", "converted_model_dir", "run_conversion"]

log = logging.getLogger("recserve.convert")  # the conversion's messages, wherever it is asked for

# Requests a conversion at load is checked on against TensorFlow (which is there: it converted).
LOAD_CHECK_REQUESTS = 50
# The subprocess's exit status when TensorFlow or tf2onnx cannot be imported.
MISSING_EXTRA = 3
_TIMEOUT_S = 1800.0


def cache_root() -> Path:
    root = os.environ.get("RECSERVE_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "recserve")
    return Path(root, "savedmodels")


def conversion_key(savedmodel_dir: str, signature_name: str | None) -> str:
    digest = hashlib.sha256(f"recserve {recserve.__version__}\0signature {signature_name or ''}\0".encode())
    root = Path(savedmodel_dir)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def missing_extra_message(savedmodel_dir: str) -> str:
    return (f"savedmodel_dir {savedmodel_dir} is a TensorFlow SavedModel and converting it needs TensorFlow and "
            "tf2onnx: pip install 'recserve[tensorflow]', or convert it where they are installed with "
            f"`recserve convert {savedmodel_dir} OUT_DIR` and point savedmodel_dir at OUT_DIR")


def run_conversion(savedmodel_dir: str, out_dir: str, signature_name: str | None = None, check: int = 0) -> str:
    """`python -m recserve.convert` in a subprocess: its report (stdout); ModelLoadError with
    its message on failure."""
    argv = [sys.executable, "-m", "recserve.convert", savedmodel_dir, out_dir]
    if signature_name:
        argv += ["--signature", signature_name]
    if check:
        argv += ["--check", str(check)]
    # The same recserve as this process's, whatever the subprocess's working directory.
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(recserve.__file__)))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, TF_CPP_MIN_LOG_LEVEL=os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False, env=env)
    except subprocess.TimeoutExpired as exc:
        raise ModelLoadError(f"converting {savedmodel_dir} took over {_TIMEOUT_S:.0f} s; gave up") from exc
    if done.returncode == MISSING_EXTRA:
        raise ModelLoadError(missing_extra_message(savedmodel_dir))
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.startswith("recserve: ")]
        why = lines[-1][len("recserve: "):] if lines else (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelLoadError(f"converting the SavedModel {savedmodel_dir} failed: {why}")
    for line in done.stdout.splitlines():
        if line.startswith("warning: "):
            log.warning("%s: %s", savedmodel_dir, line[len("warning: "):])
    return done.stdout


def converted_model_dir(savedmodel_dir: str, signature_name: str | None = None) -> str:
    """The cached conversion of `savedmodel_dir` (converted now if absent)."""
    target = cache_root() / conversion_key(savedmodel_dir, signature_name)
    if target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name[:16]}-", dir=target.parent))
    try:
        report = run_conversion(savedmodel_dir, str(stage / "model"), signature_name, LOAD_CHECK_REQUESTS)
        for line in report.splitlines():
            if line.startswith("parity: "):
                log.info("%s: %s", savedmodel_dir, line)
        try:
            os.rename(stage / "model", target)
        except OSError:
            if not target.is_dir():  # another process's rename won the race: use theirs
                raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return str(target)
