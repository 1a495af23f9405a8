"""Loading a DeepRec / TensorFlow checkpoint (issue #11): a Processor's ready time per GiB of
table rows from a TF bundle, beside the same rows in recserve's own format, same run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.models import build_dlrm
from benchmarks.report import Row
from recserve import Processor

TOTAL_ROWS = 16_000_000  # 26 tables x ~615k rows x 16 floats: ~1.0 GiB of rows
NOTES = """DLRM-like model (26 tables, 16M rows x 16 in all, random int64 keys). The same rows
twice: recserve's format (safetensors + MANIFEST.json, sha256 verified before the load) and a
TF bundle written by `tf.raw_ops.SaveV2` as DeepRec writes Embedding Variables (`t<i>-keys`,
`t<i>-values`; crc32c of every tensor checked as it is read). Ready: `Processor(config)` from
the call to its return, best of 2, page cache warm. GiB are of table rows (values)."""


def _ready(config: dict[str, object]) -> float:
    best = float("inf")
    for _ in range(2):
        started = time.perf_counter()
        processor = Processor(config)
        best = min(best, time.perf_counter() - started)
        processor.close()
    return best


WRITER = Path(__file__).resolve().parent.parent / "tests" / "model_store" / "tf_writer.py"


def _save_bundle(prefix: Path, tensors: dict[str, np.ndarray]) -> None:
    """TensorFlow (the test extra) writes it, in a process of its own (tf_writer.py says why)."""
    npz = prefix.parent / "tensors.npz"
    np.savez(npz, **tensors)
    job = json.dumps({"prefix": str(prefix), "npz": str(npz), "shards": 1}) + "\n"
    answer = subprocess.run([sys.executable, str(WRITER)], input=job, capture_output=True, text=True, check=True)
    npz.unlink()
    if answer.stdout.strip() != "ok":
        raise RuntimeError(f"writing the TF bundle failed: {answer.stdout.strip()}")


def run() -> list[Row]:
    root = Path(tempfile.mkdtemp(prefix="recserve-bench-deeprec-"))
    try:
        model = build_dlrm(root / "recserve", total_rows=TOTAL_ROWS)
        gib = sum(v.nbytes for v in model.values) / 2**30
        version = root / "tf" / "v1"
        version.mkdir(parents=True)
        tensors = {}
        for i, (keys, values) in enumerate(zip(model.keys, model.values)):
            tensors[f"t{i}-keys"], tensors[f"t{i}-values"] = keys, values
        _save_bundle(version / "model.ckpt-1", tensors)
        (version / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1"\n')
        ours = _ready(model.config())
        theirs = _ready({**model.config(), "checkpoint_dir": str(root / "tf")})
        ratio = (gib / theirs) / (gib / ours)
        return [Row(f"ready from a TF bundle / from recserve's format ({gib:.2f} GiB of rows)",
                    f"{gib / theirs:.2f} GiB/s ({theirs:.2f} s)", f"{gib / ours:.2f} GiB/s ({ours:.2f} s)", ratio)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
