"""Running tf_model.py (real TensorFlow, in its own processes) for the SavedModel tests."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def run_tf(*args: str, script: str = "tf_model.py") -> None:
    done = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True,
                          timeout=300, check=False, cwd=HERE)
    assert done.returncode == 0, done.stderr[-3000:]


def tf_predict(savedmodel: Path, batches: Sequence[dict[str, np.ndarray]], tmp: Path,
               checkpoint: str | None = None, rows: Path | None = None, tf2: bool = False) -> list[np.ndarray]:
    """TensorFlow's session.run on the SavedModel (optionally restored from `checkpoint`, and
    with the rows of `rows` (npz: name, keys, values) written into that variable); `tf2`:
    `tf.saved_model.load`'s signature instead (keras_model.py)."""
    reqs, out = tmp / "requests.npz", tmp / "predictions.npz"
    np.savez(reqs, n=len(batches), **{f"{i}/{k}": v for i, r in enumerate(batches) for k, v in r.items()})
    if tf2:
        run_tf("predict", str(savedmodel), str(reqs), str(out), script="keras_model.py")
    else:
        run_tf("predict", str(savedmodel), str(reqs), str(out), checkpoint or "", str(rows or ""))
    with np.load(out) as data:
        return [data[str(i)] for i in range(len(batches))]
