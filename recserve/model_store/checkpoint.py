"""Reading a version's parameters: embedding tables and dense initializers (DESIGN §4).

`embedding/<table>.safetensors` holds tensors `keys` int64 [N], `values` float32 [N, D],
optional `freqs` and `versions` int64 [N], and in a delta optional `deleted` int64 [M]
(DeepRec's Embedding Variable export tensors without their `<name>-` prefix). A table name
may contain "/" (DeepRec variable names do); the file then sits in subdirectories.
`dense.safetensors` maps graph initializer names to their values.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import safetensors
import safetensors.numpy

from recserve.errors import CorruptVersionError, ModelLoadError
from recserve.model_spec import EmbeddingBinding
from recserve.model_store.manifest import TF_BUNDLE_FORMAT, Manifest
from recserve.model_store.storage import Storage, join
from recserve.model_store.table_data import TableData, mod_partition_ids
from recserve.model_store.versions import VersionRef

__all__ = [
    "DENSE_FILE",
    "EMBEDDING_DIR",
    "TABLE_TENSORS",
    "Checkpoint",
    "TableData",
    "bound_table_rows",
    "load_checkpoint",
    "read_dense",
    "read_table",
    "table_file",
    "with_deltas",
]

DENSE_FILE = "dense.safetensors"
EMBEDDING_DIR = "embedding/"
TABLE_SUFFIX = ".safetensors"
TABLE_TENSORS = ("keys", "values", "freqs", "versions", "deleted")


def table_file(table: str) -> str:
    """The path of `table`'s file relative to a version dir."""
    return f"{EMBEDDING_DIR}{table}{TABLE_SUFFIX}"


def _read_tensors(storage: Storage, path: str, *, rows: str | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file. A local file's float32 2-D tensor named `rows` (a
    table's values) is not read: it comes back as a read-only view of the file's mapping, so
    a table larger than RAM streams into the SSD tier through the page cache, and a DRAM
    table copies it once into its own row layout (row_memory.empty_rows)."""
    local = storage.local_path(path)
    try:
        if local is None:
            tensors = safetensors.numpy.load(storage.read(path))
            if rows in tensors and tensors[rows].dtype == np.float32 and tensors[rows].ndim == 2:
                tensors[rows].flags.writeable = False  # the table copies it into its layout
            return tensors
        with safetensors.safe_open(local, framework="np") as f:  # validates header and offsets
            names = list(f.keys())
            mapped = _mapped_rows(local, rows) if rows in names else None
            return {name: mapped if name == rows and mapped is not None else f.get_tensor(name) for name in names}
    except (safetensors.SafetensorError, ValueError, KeyError, OSError) as exc:
        raise CorruptVersionError(f"{path}: not a readable safetensors file ({exc})") from exc


def _mapped_rows(path: str, name: str) -> np.ndarray | None:
    """Tensor `name` of a safetensors file as a read-only view of its mapping, when it is a
    non-empty float32 [N, D]; None otherwise (it is then read the library's way). The layout
    (8-byte header length, JSON header with data_offsets, data) is safetensors' spec; the
    library has no call that maps a tensor without copying it."""
    with open(path, "rb") as f:
        (header_size,) = struct.unpack("<Q", f.read(8))
        entry = json.loads(f.read(header_size))[name]
        shape, (begin, end) = entry["shape"], entry["data_offsets"]
        if entry["dtype"] != "F32" or len(shape) != 2 or shape[0] * shape[1] == 0 or end - begin != 4 * shape[0] * shape[1]:
            return None
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    # Read in order, once: let the kernel read ahead. (np.memmap was measured 5-10x slower
    # to copy from than a plain mapping under np.frombuffer.)
    mapping.madvise(mmap.MADV_SEQUENTIAL)
    count = shape[0] * shape[1]
    return np.frombuffer(mapping, dtype="<f4", count=count, offset=8 + header_size + begin).reshape(shape[0], shape[1])


def read_table(storage: Storage, path: str, *, check_unique: bool = True) -> TableData:
    tensors = _read_tensors(storage, path, rows="values")
    unknown = sorted(set(tensors) - set(TABLE_TENSORS))
    if unknown:
        raise CorruptVersionError(
            f"{path}: unknown tensor(s) {unknown}; valid names are {list(TABLE_TENSORS)}"
        )
    missing = [name for name in ("keys", "values") if name not in tensors]
    if missing:
        raise CorruptVersionError(f"{path}: missing tensor(s) {missing}")
    try:
        return TableData(**tensors, check_unique=check_unique)
    except CorruptVersionError as exc:
        raise CorruptVersionError(f"{path}: {exc}") from exc


def read_dense(storage: Storage, path: str) -> dict[str, np.ndarray]:
    return _read_tensors(storage, path)


@dataclass
class Checkpoint:
    """A loaded full version or delta. Read-only once built; safe to share."""

    ref: VersionRef
    manifest: Manifest
    tables: dict[str, TableData]
    dense: dict[str, np.ndarray]
    # Reads the version again, tables included: for the one who needs the rows after all
    # (a Redis import of a version loaded with tables=False; a re-import after Redis lost
    # it, of the version and its deltas) without holding them meanwhile.
    with_tables: Callable[[], Checkpoint] | None = None


def with_deltas(full: Checkpoint, deltas: Sequence[Checkpoint]) -> Checkpoint:
    """`full` with `deltas` applied in order, as the engine applies them (each delta's rows
    upserted, then its `deleted` keys removed): the state to import into a Redis that lost
    the version. Keys and values only (a Redis import writes nothing else)."""
    tables = dict(full.tables)
    for delta in deltas:
        for name, change in delta.tables.items():
            base = tables.get(name)
            if base is None:
                continue  # a table the version does not have: skipped, as apply_delta does
            keys = np.concatenate([change.keys, base.keys])
            values = np.concatenate([change.values, base.values])
            _, first = np.unique(keys, return_index=True)  # the delta's rows come first: they win
            keep = np.sort(first)
            keys, values = keys[keep], values[keep]
            if change.deleted is not None and len(change.deleted):
                alive = ~np.isin(keys, change.deleted)
                keys, values = keys[alive], values[alive]
            tables[name] = TableData(keys, values, check_unique=False)
    return Checkpoint(ref=full.ref, manifest=full.manifest, tables=tables, dense=full.dense,
                      with_tables=full.with_tables)


def load_checkpoint(storage: Storage, ref: VersionRef, manifest: Manifest, *, tables: bool = True) -> Checkpoint:
    """Read every table and the dense file listed in `manifest`; with tables=False only the
    dense file (a replica serving tables from Redis reads rows only if it imports them).

    Does not verify checksums: call `verify` first (`newest_complete_version` does). A full
    version's tables are not checked for duplicate keys here: bound_table_rows checks them,
    or leaves it to the engine's index build (build_tables); a delta's are.
    Files the manifest lists outside `embedding/*.safetensors` and `dense.safetensors`
    are left alone."""
    if manifest.format == TF_BUNDLE_FORMAT:
        from recserve.model_store.tf_checkpoint import tf_tables_and_dense

        tf_tables, tf_dense = tf_tables_and_dense(storage, ref.path if manifest.kind == "delta"
                                                  else _tf_prefix(ref, manifest), delta=manifest.kind == "delta")
        return Checkpoint(ref=ref, manifest=manifest, tables=tf_tables, dense=tf_dense)  # type: ignore[arg-type]
    rows: dict[str, TableData] = {}
    dense: dict[str, np.ndarray] = {}
    for name in sorted(manifest.files):
        if name == DENSE_FILE:
            dense = read_dense(storage, join(ref.path, name))
        elif tables and name.startswith(EMBEDDING_DIR) and name.endswith(TABLE_SUFFIX):
            table = name[len(EMBEDDING_DIR) : -len(TABLE_SUFFIX)]
            if table:
                rows[table] = read_table(storage, join(ref.path, name), check_unique=manifest.kind == "delta")
    return Checkpoint(ref=ref, manifest=manifest, tables=rows, dense=dense,
                      with_tables=lambda: load_checkpoint(storage, ref, manifest))


def _tf_prefix(ref: VersionRef, manifest: Manifest) -> str:
    index = next(name for name in manifest.files if name.endswith(".index"))
    return join(ref.path, index[: -len(".index")])


def bound_table_rows(
    bindings: Sequence[EmbeddingBinding], checkpoint: Checkpoint, names: Callable[[str], str] = str,
    *, engine_checks_keys: bool = False,
) -> dict[str, tuple[EmbeddingBinding, TableData]]:
    """Each table the bindings name, with its first binding and its rows in `checkpoint`;
    ModelLoadError when a table is missing or its dim differs from the binding's,
    CorruptVersionError when its keys repeat (unless `engine_checks_keys`: the caller builds
    EmbeddingTables, whose index build refuses a repeated key; see duplicate_key_error)."""
    found: dict[str, tuple[EmbeddingBinding, TableData]] = {}
    for b in bindings:
        if b.table in found:
            continue
        stored = names(b.table)
        data = checkpoint.tables.get(stored)
        if data is None:
            what = f"table {b.table!r}" if stored == b.table else f"table {b.table!r} (checkpoint name {stored!r})"
            raise ModelLoadError(
                f"{what} (bound by input {b.input!r}) is not in checkpoint version "
                f"{checkpoint.ref.name!r}; it has tables {sorted(checkpoint.tables)}"
            )
        if data.values.shape[1] != b.dim:
            raise ModelLoadError(
                f"table {b.table!r} in version {checkpoint.ref.name!r} has dim {data.values.shape[1]}, "
                f"but model.json binds it with dim {b.dim}"
            )
        if b.mod_partitions and checkpoint.manifest.format == TF_BUNDLE_FORMAT:  # keyed by row index there
            data = mod_partition_ids(data, b.mod_partitions, f"{checkpoint.ref.path}: table {stored!r}")
        if not engine_checks_keys:
            try:
                data.require_unique()
            except CorruptVersionError as exc:
                raise duplicate_key_error(checkpoint, stored, str(exc)) from exc
        found[b.table] = (b, data)
    return found


def duplicate_key_error(checkpoint: Checkpoint, table: str, problem: str) -> CorruptVersionError:
    """The error for a table of `checkpoint` whose keys repeat, naming where it is stored."""
    where = (join(checkpoint.ref.path, table_file(table)) if checkpoint.manifest.format != TF_BUNDLE_FORMAT
             else f"{checkpoint.ref.path}: table {table!r}")
    return CorruptVersionError(f"{where}: {problem}")
