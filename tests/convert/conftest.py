"""Fixtures of the SavedModel tests: a TF1 feature-column model written by real TensorFlow
(tf_model.py, in a subprocess) once per session, its conversion cache, and TensorFlow's own
predictions for comparison."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tf_model import requests

__all__ = ["requests"]


def run_tf(*args: str) -> None:
    done = subprocess.run([sys.executable, str(HERE / "tf_model.py"), *args], capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="session")
def tf_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OUT/savedmodel, OUT/ckpt/1, OUT/ckpt/2 (+ .incremental_checkpoint), OUT/incr.npz."""
    out = tmp_path_factory.mktemp("tfmodel") / "m"
    run_tf("write", str(out))
    return out


@pytest.fixture(scope="session", autouse=True)
def conversion_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Conversions are cached here for the session (one conversion per SavedModel)."""
    mp = pytest.MonkeyPatch()
    cache = tmp_path_factory.mktemp("recserve-cache")
    mp.setenv("RECSERVE_CACHE_DIR", str(cache))
    yield cache
    mp.undo()


def tf_predict(savedmodel: Path, batches: Sequence[dict[str, np.ndarray]], tmp: Path,
               checkpoint: str | None = None, rows: Path | None = None) -> list[np.ndarray]:
    """TensorFlow's session.run on the SavedModel (optionally restored from `checkpoint`, and
    with the rows of `rows` (npz: name, keys, values) written into that variable)."""
    reqs, out = tmp / "requests.npz", tmp / "predictions.npz"
    np.savez(reqs, n=len(batches), **{f"{i}/{k}": v for i, r in enumerate(batches) for k, v in r.items()})
    run_tf("predict", str(savedmodel), str(reqs), str(out), checkpoint or "", str(rows or ""))
    with np.load(out) as data:
        return [data[str(i)] for i in range(len(batches))]
