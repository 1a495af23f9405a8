"""The `{"rows": "<file>.npy"}` defaults of a model dir's bindings, read and checked once as
the model dir is read (DESIGN §4): every table then gets its matrix with its DefaultSpec.

A valid file is a .npy array of shape [k, dim] (k >= 1, dim the binding's) whose values
float32 holds exactly: float32 itself, or e.g. float64 / int arrays that round-trip.
"""

from __future__ import annotations

import dataclasses
import io

import numpy as np

from recserve.errors import ModelLoadError
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec
from recserve.model_store.storage import Storage, join

__all__ = ["load_default_rows", "valid_default_rows"]


def valid_default_rows(dim: int) -> str:
    return f"valid is a .npy file of float32 [k, {dim}] (k >= 1; another dtype only if float32 holds its values exactly)"


def _matrix(storage: Storage, model_dir: str, b: EmbeddingBinding) -> np.ndarray:
    path = join(model_dir, b.default.rows_file)
    what = f"table {b.table!r}: default rows file {b.default.rows_file!r} (in {model_dir})"
    if storage.size(path) is None:
        raise ModelLoadError(f"{what} does not exist; {valid_default_rows(b.dim)}")
    try:
        raw = np.load(io.BytesIO(storage.read(path)), allow_pickle=False)
    except Exception as exc:  # ValueError, OSError, EOFError, UnpicklingError: not a .npy
        raise ModelLoadError(f"{what} is not a readable .npy file ({exc}); {valid_default_rows(b.dim)}") from exc
    if not isinstance(raw, np.ndarray) or raw.ndim != 2 or raw.shape[0] < 1 or raw.shape[1] != b.dim \
            or raw.dtype.kind not in "fiu":
        dtype, shape = getattr(raw, "dtype", type(raw).__name__), list(getattr(raw, "shape", ()))
        raise ModelLoadError(f"{what} holds {dtype} of shape {shape}; {valid_default_rows(b.dim)}")
    matrix = np.ascontiguousarray(raw, dtype=np.float32)
    if raw.dtype != np.float32 and not np.array_equal(matrix.astype(raw.dtype), raw, equal_nan=raw.dtype.kind == "f"):
        raise ModelLoadError(f"{what} holds {raw.dtype} values that float32 does not hold exactly; "
                             f"{valid_default_rows(b.dim)}")
    matrix.flags.writeable = False
    return matrix


def load_default_rows(spec: ModelSpec, storage: Storage, model_dir: str) -> ModelSpec:
    """`spec` with the matrix of every `{"rows": file}` default read from `model_dir`
    (ModelLoadError naming the table and the file when one is missing or not valid)."""
    if not any(b.default.kind == "rows" for b in spec.embeddings):
        return spec
    matrices: dict[tuple[str, int], np.ndarray] = {}
    bindings = []
    for b in spec.embeddings:
        if b.default.kind == "rows":
            matrix = matrices.get((b.default.rows_file, b.dim))
            if matrix is None:
                matrix = matrices[b.default.rows_file, b.dim] = _matrix(storage, model_dir, b)
            b = dataclasses.replace(b, default=DefaultSpec(kind="rows", rows_file=b.default.rows_file, matrix=matrix))
        bindings.append(b)
    return dataclasses.replace(spec, embeddings=tuple(bindings))
