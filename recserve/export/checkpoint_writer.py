"""Writing checkpoint versions and deltas (DESIGN §4), for trainers and importers.

A version is staged and renamed into place with its MANIFEST.json written last, so a
server polling the checkpoint dir sees either nothing or the whole version.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import safetensors.numpy

from recserve.errors import CorruptVersionError, ModelLoadError
from recserve.export.staging import file_entries, staged_dir, write_manifest
from recserve.model_store.checkpoint import DENSE_FILE, TableData, table_file
from recserve.model_store.manifest import Manifest, check_relative_path, read_manifest
from recserve.model_store.storage import LocalStorage
from recserve.model_store.versions import DELTA_DIR_NAMES, list_deltas

__all__ = ["PADDING_KEY", "TableInput", "write_checkpoint", "write_delta"]

# Requests pad multi-hot ids with -1 (DESIGN §4), so no table may hold it as a key.
PADDING_KEY = -1
TableInput = TableData | tuple[np.ndarray, np.ndarray]
# Dtypes safetensors stores and onnxruntime initializers can take.
_DENSE_DTYPES = frozenset(
    np.dtype(t) for t in (np.float64, np.float32, np.float16, np.int64, np.int32,
                          np.int16, np.int8, np.uint64, np.uint32, np.uint16, np.uint8, np.bool_)
)


def write_checkpoint(
    checkpoint_dir: str | os.PathLike[str],
    tables: Mapping[str, TableInput],
    *,
    global_step: int,
    name: str | None = None,
    dense: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Write a full version `<checkpoint_dir>/<name>` (default name: str(global_step)).

    `tables` maps table name -> TableData or (keys int64 [N], values float32 [N, D]);
    `dense` maps graph initializer names to the values that replace them when served.
    Raises CorruptVersionError for invalid data, StorageError if the version exists."""
    _check_step(global_step)
    name = str(global_step) if name is None else name
    if check_relative_path(name) or "/" in name or name.startswith("."):
        raise CorruptVersionError(
            f"version name {name!r} is invalid; it must be one path component not starting with '.'"
        )
    checked = _check_tables(tables, allow_deleted=False)
    checked_dense = _check_dense(dense or {})
    with staged_dir(Path(checkpoint_dir) / name) as stage:
        _write_tables(stage, checked)
        if checked_dense:
            safetensors.numpy.save_file(checked_dense, stage / DENSE_FILE)
        write_manifest(stage, Manifest("full", global_step, file_entries(stage)))
    return Path(checkpoint_dir) / name


def write_delta(
    version_dir: str | os.PathLike[str],
    tables: Mapping[str, TableInput],
    *,
    global_step: int,
) -> Path:
    """Write a delta `<version_dir>/.incremental_ckpt/<global_step>/` of changed rows.

    `TableData.deleted` lists keys to remove. `global_step` must exceed the full version's
    and every existing delta's, since servers apply only deltas newer than what they serve."""
    _check_step(global_step)
    storage = LocalStorage()
    full = read_manifest(storage, os.fspath(version_dir))
    if full.kind != "full":
        raise ModelLoadError(f"{version_dir} is a {full.kind} version; deltas go on a full one")
    deltas = list_deltas(storage, os.fspath(version_dir), full.global_step)
    newest = max([full.global_step] + [ref.global_step for ref in deltas])
    if global_step <= newest:
        raise CorruptVersionError(
            f"delta global_step {global_step} must exceed {newest}, "
            f"the newest step of {version_dir}"
        )
    checked = _check_tables(tables, allow_deleted=True)
    target = Path(version_dir) / DELTA_DIR_NAMES[0] / str(global_step)
    with staged_dir(target) as stage:
        _write_tables(stage, checked)
        write_manifest(
            stage, Manifest("delta", global_step, file_entries(stage), base_global_step=full.global_step)
        )
    return target


def _check_step(global_step: int) -> None:
    if not isinstance(global_step, int) or isinstance(global_step, bool) or global_step < 0:
        raise CorruptVersionError(f"global_step is {global_step!r}; it must be an integer >= 0")


def _check_tables(tables: Mapping[str, TableInput], *, allow_deleted: bool) -> dict[str, TableData]:
    checked: dict[str, TableData] = {}
    for table, data in tables.items():
        problem = check_relative_path(table_file(table)) if isinstance(table, str) else "not a str"
        if problem or table.startswith("."):
            raise CorruptVersionError(
                f"table name {table!r} is invalid: {problem or 'it must not start with .'}"
            )
        try:
            if isinstance(data, tuple) and len(data) == 2:
                data = TableData(keys=data[0], values=data[1])
            elif not isinstance(data, TableData):
                raise CorruptVersionError(
                    f"expected TableData or (keys, values), got {type(data).__name__}"
                )
        except CorruptVersionError as exc:
            raise CorruptVersionError(f"table {table!r}: {exc}") from exc
        if np.any(data.keys == PADDING_KEY):
            raise CorruptVersionError(
                f"table {table!r}: key {PADDING_KEY} is the padding id and cannot be stored"
            )
        if data.deleted is not None and not allow_deleted:
            raise CorruptVersionError(
                f"table {table!r}: 'deleted' keys belong in a delta (write_delta), "
                "not a full version"
            )
        checked[table] = data
    return checked


def _check_dense(dense: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    checked: dict[str, np.ndarray] = {}
    for name, value in dense.items():
        if not isinstance(name, str) or not name:
            raise CorruptVersionError(f"dense name {name!r} is invalid; it must be a non-empty str")
        if not isinstance(value, np.ndarray):
            raise CorruptVersionError(
                f"dense {name!r} is a {type(value).__name__}; expected a numpy array"
            )
        if value.dtype not in _DENSE_DTYPES:
            raise CorruptVersionError(
                f"dense {name!r} has dtype {value.dtype}; valid dtypes are "
                f"{sorted(d.name for d in _DENSE_DTYPES)}"
            )
        checked[name] = np.ascontiguousarray(value)
    return checked


def _write_tables(stage: Path, tables: Mapping[str, TableData]) -> None:
    for table, data in tables.items():
        path = stage / table_file(table)
        path.parent.mkdir(parents=True, exist_ok=True)
        tensors = {k: np.ascontiguousarray(v) for k, v in data.tensors().items()}
        safetensors.numpy.save_file(tensors, path)
