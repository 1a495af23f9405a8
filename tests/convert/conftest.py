"""Fixtures of the SavedModel tests: a TF1 feature-column model written by real TensorFlow
(tf_model.py, in a subprocess) once per session, and its conversion cache. TensorFlow never
runs in pytest's process (tf_helpers.py runs it)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from tf_helpers import run_tf


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
