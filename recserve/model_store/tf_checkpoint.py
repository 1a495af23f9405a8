"""DeepRec / TensorFlow checkpoints as versions and deltas (DESIGN §4b).

A version directory holding a TensorFlow `checkpoint` state file is a TF version: its full
version is the highest `<prefix>-<N>.index` in it (global_step N), complete when the state
file names that prefix and its data shards are all there; its deltas are the incremental
bundles `<prefix>-<S>.index` in `.incremental_checkpoint/` (or `.incremental_ckpt/`), of
which the newest above the serving step is enough: each holds every row changed since the
full save. Both come out as a `Manifest` of format TF_BUNDLE_FORMAT (file sizes, no sha256:
every tensor's crc32c is checked as it is read) and load as a `Checkpoint`:

- an Embedding Variable E is `E-keys` + `E-values` (+ `E-freqs`, `E-versions`); a
  partitioned one is `E/part_<k>-...`, merged into one table E; `E-keys_filtered` and
  optimizer slots (`E/Adagrad`, `E/part_0/Adam`, ...: any other EV) are never read unless
  a table maps to them. Incremental bundles hold `E-sparse_incr_keys` / `-sparse_incr_values`.
- every other float tensor is a dense variable, read only when an initializer maps to it;
  a 2-D one is also a table keyed by row index (a plain or partitioned TF variable that a
  converted SavedModel looks up, DESIGN §4c; its sliced form is assembled).
Tables and dense values are read on first use (a `Mapping` over the bundle), so a bundle
full of optimizer slots costs nothing it does not serve.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import numpy as np

from recserve.errors import CorruptVersionError, VersionNotReadyError
from recserve.model_store.manifest import DELTA_DIR_NAMES, TF_BUNDLE_FORMAT, FileEntry, Manifest
from recserve.model_store.row_memory import empty_rows
from recserve.model_store.storage import Storage, join
from recserve.model_store.table_data import TableData
from recserve.model_store.tensor_bundle import TensorBundle

__all__ = ["STATE_FILE", "dense_by_initializer", "is_tf_version", "tf_delta", "tf_delta_manifest", "tf_tables_and_dense",
           "tf_version_manifest"]

STATE_FILE = "checkpoint"
_STEP = re.compile(r"^(?P<prefix>.+)-(?P<step>\d+)\.index$")
_STATE_PATH = re.compile(r'^model_checkpoint_path:\s*"(?P<path>[^"]*)"\s*$', re.MULTILINE)
_PART = re.compile(r"^(?P<ev>.+)/part_(?P<k>\d+)$")
_FULL = ("-keys", "-values", "-freqs", "-versions")
_INCREMENTAL = ("-sparse_incr_keys", "-sparse_incr_values", "-sparse_incr_freqs", "-sparse_incr_versions")


def is_tf_version(storage: Storage, version_dir: str) -> bool:
    return storage.size(join(version_dir, STATE_FILE)) is not None


def _local(storage: Storage, path: str) -> str:
    local = storage.local_path(path)
    if local is None:
        raise CorruptVersionError(
            f"{path}: TensorFlow checkpoints are read from a local checkpoint_dir (model_store_type local) so far")
    return local


def _bundles(storage: Storage, directory: str) -> dict[int, str]:
    """step -> bundle prefix (full path) of every `<name>-<step>.index` in `directory`."""
    out = {}
    for name in storage.list(directory):
        match = _STEP.match(name)
        if match:
            out[int(match["step"])] = join(directory, name[: -len(".index")])
    return out


def _manifest(storage: Storage, prefix: str, kind: str, step: int, base: int | None) -> Manifest:
    bundle = TensorBundle(_local(storage, prefix))
    try:
        files = {}
        for path in [f"{prefix}.index", *(prefix + p[len(bundle.prefix):] for p in bundle.shard_paths())]:
            size = storage.size(path)
            if size is None:
                raise CorruptVersionError(f"{path} is missing: the bundle's index lists {bundle.num_shards} shard(s)")
            files[path.rsplit("/", 1)[-1]] = FileEntry(size, "")
    finally:
        bundle.close()
    return Manifest(kind, step, files, format=TF_BUNDLE_FORMAT, base_global_step=base)  # type: ignore[arg-type]


def tf_version_manifest(storage: Storage, version_dir: str) -> Manifest:
    """The full version of a TF version directory; VersionNotReadyError while it is being
    written, CorruptVersionError when it cannot be read."""
    bundles = _bundles(storage, version_dir)
    state_path = join(version_dir, STATE_FILE)
    if not bundles:
        raise VersionNotReadyError(f"{version_dir} has a {STATE_FILE} file but no <prefix>-<step>.index yet")
    step = max(bundles)
    prefix = bundles[step]
    text = storage.read(state_path).decode("utf-8", "replace")
    named = _STATE_PATH.search(text)
    if named is None:
        raise CorruptVersionError(f"{state_path}: no model_checkpoint_path line")
    wanted = named["path"].rsplit("/", 1)[-1]
    if wanted != prefix.rsplit("/", 1)[-1]:
        if storage.size(join(version_dir, wanted + ".index")) is None:
            raise VersionNotReadyError(f"{state_path} names {wanted!r}, which has no .index (yet)")
        raise VersionNotReadyError(
            f"{state_path} names {wanted!r}; the newest bundle is {prefix.rsplit('/', 1)[-1]!r} (still being written)")
    return _manifest(storage, prefix, "full", step, None)


def tf_delta(storage: Storage, version_dir: str, full_step: int, after_step: int) -> tuple[str, Manifest] | None:
    """The newest incremental bundle of a TF version above `after_step`: (its prefix path,
    its manifest), or None. Each one holds every row changed since the full save."""
    found: dict[int, str] = {}
    for name in DELTA_DIR_NAMES:
        directory = join(version_dir, name)
        if storage.is_dir(directory):
            found.update(_bundles(storage, directory))
    newer = [s for s in found if s > max(after_step, full_step)]
    if not newer:
        return None
    step = max(newer)
    return found[step], _manifest(storage, found[step], "delta", step, full_step)


def tf_delta_manifest(storage: Storage, prefix: str) -> Manifest:
    """The manifest of incremental bundle `prefix` (<version>/<delta dir>/<name>-<step>)."""
    version_dir = prefix.rsplit("/", 2)[0]
    match = _STEP.match(prefix.rsplit("/", 1)[-1] + ".index")
    if match is None or storage.size(prefix + ".index") is None:
        raise VersionNotReadyError(f"{prefix}.index is absent")
    full = tf_version_manifest(storage, version_dir)
    return _manifest(storage, prefix, "delta", int(match["step"]), full.global_step)


class _LazyBundle(Mapping[str, object]):
    """Tables (EV name -> TableData) or dense values (TF name -> array) of a bundle, read on
    first use and kept."""

    def __init__(self, names: list[str], read: object) -> None:
        self._names = names
        self._read = read
        self._done: dict[str, object] = {}

    def __getitem__(self, name: str) -> object:
        if name not in self._names:
            raise KeyError(name)
        if name not in self._done:
            self._done[name] = self._read(name)  # type: ignore[operator]
        return self._done[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def tf_tables_and_dense(storage: Storage, prefix: str, *, delta: bool) -> tuple[Mapping[str, object], Mapping[str, object]]:
    """The bundle's Embedding Variables as tables, and its other float tensors as dense values."""
    bundle = TensorBundle(_local(storage, prefix))
    suffixes = _INCREMENTAL if delta else _FULL
    keys_suffix = suffixes[0]
    parts: dict[str, list[str]] = {}
    ev_tensors: set[str] = set()
    for name in bundle.entries:
        if name.endswith(keys_suffix):
            base = name[: -len(keys_suffix)]
            match = _PART.match(base)
            ev = match["ev"] if match else base
            parts.setdefault(ev, []).append(base)
            ev_tensors.update(base + s for s in suffixes)
    for ev, bases in parts.items():
        bases.sort(key=lambda b: int(_PART.match(b)["k"]) if _PART.match(b) else -1)  # type: ignore[index]

    def read_ev(ev: str) -> TableData:
        columns: dict[str, list[np.ndarray]] = {"keys": [], "values": [], "freqs": [], "versions": []}
        for base in parts[ev]:
            for column, suffix in zip(columns, suffixes):
                if base + suffix in bundle.entries:
                    columns[column].append(bundle.read(base + suffix))
                elif column in ("keys", "values"):
                    raise CorruptVersionError(f"{prefix}: Embedding Variable {ev!r} has no tensor {base + suffix!r}")
        keys = [k.astype(np.int64, copy=False).reshape(-1) for k in columns["keys"]]
        values = columns["values"]
        for base, k, v in zip(parts[ev], keys, values):
            if v.dtype != np.float32 or v.ndim != 2 or len(v) != len(k):
                raise CorruptVersionError(
                    f"{prefix}: Embedding Variable {ev!r}: {base}{suffixes[1]} is {v.dtype} of shape {list(v.shape)}; "
                    f"expected float32 [{len(k)}, dim]")
        if len(values) == 1:
            merged_values = values[0]  # a view of the mapped shard: the table copies it once
        else:
            # Straight into the engine's row layout, which the table then adopts: one copy.
            dim = values[0].shape[1]
            if any(v.shape[1] != dim for v in values):
                raise CorruptVersionError(f"{prefix}: Embedding Variable {ev!r}: its partitions differ in dim")
            merged_values = empty_rows(sum(len(v) for v in values), dim)
            at = 0
            for v in values:
                merged_values[at:at + len(v)] = v
                at += len(v)
        merged_keys = keys[0] if len(keys) == 1 else np.concatenate(keys)
        extra = {}
        # Frequencies (a DRAM+SSD table puts the most frequent rows in DRAM) and versions come
        # along when they are views of the mapping; merging partitions' would cost 16 bytes a
        # row at the load's peak for a column DRAM tables never read.
        for column in ("freqs", "versions"):
            if len(parts[ev]) == 1 and columns[column] and columns[column][0].dtype == np.int64:
                extra[column] = columns[column][0].reshape(-1)
        try:
            return TableData(merged_keys, merged_values, **extra, check_unique=delta)
        except CorruptVersionError as exc:
            raise CorruptVersionError(f"{prefix}: Embedding Variable {ev!r}: {exc}") from exc

    dense_names = [n for n, e in bundle.entries.items() if n not in ev_tensors and e.dtype in (1, 19)
                   and not n.endswith("-keys_filtered")]
    plain = [] if delta else [n for n in dense_names if bundle.entries[n].dtype == 1 and
                              len(bundle.entries[n].shape) == 2 and n not in parts]

    def read_table(name: str) -> TableData:
        if name in parts:
            return read_ev(name)
        values = bundle.read(name)
        return TableData(np.arange(len(values), dtype=np.int64), values, check_unique=False)

    return _LazyBundle(sorted(parts) + sorted(plain), read_table), _LazyBundle(dense_names, bundle.read)


class _ByInitializer(Mapping[str, object]):
    def __init__(self, dense: Mapping[str, object], names: Mapping[str, str]) -> None:
        self._dense = dense
        self._names = names
        self._inverse = {tf: init for init, tf in names.items()}

    def __contains__(self, init: object) -> bool:
        return isinstance(init, str) and self._names.get(init, init) in self._dense

    def __getitem__(self, init: str) -> object:
        return self._dense[self._names.get(init, init)]

    def __iter__(self) -> Iterator[str]:
        return (self._inverse.get(tf, tf) for tf in self._dense)

    def __len__(self) -> int:
        return len(self._dense)


def dense_by_initializer(dense: Mapping[str, object], names: Mapping[str, str]) -> Mapping[str, object]:
    """A TF checkpoint's dense values keyed by the ONNX initializers they feed: through
    model.json's checkpoint_names, else by their own name (read when asked for)."""
    return _ByInitializer(dense, names)
