"""A slow, independent reference of what serving a model must compute (DESIGN §4).

Uses only numpy, onnxruntime, xxhash and the files on disk — never the embedding engine,
not even its generator of default rows — so parity tests can compare the Processor against
it. Semantics implemented here:

- a binding looks its request ids up in its table; strings hash with XXH64 (seed 0) of
  their UTF-8 bytes read as int64, the empty string being padding; with `buckets` (a
  converted SavedModel's `"key_hash": "farmhash64_mod"`) a string's key is TensorFlow's
  Fingerprint64 modulo the buckets -- here the one exception to "never the engine": the
  engine's pure-Python Fingerprint64 (recserve/embedding/_purekeys.py, checked against
  TensorFlow itself in tests/convert/test_tf_string_hash.py; serving uses the C one); with a
  `vocabulary`, a string's key is `vocabulary_start` + its (last) position in the list
  (null entries are ids no string has); an absent string gets `oov_start` + Fingerprint64 %
  `oov_buckets` when there are OOV buckets, else `default_id` (-1: padding); the empty
  string is padding unless `empty_is_padding` is false (buckets and vocabularies: then it is
  a string like any other);
- padding (-1) gives a zero row; an unknown key gives the table default: zeros, or for
  `{"normal": ...}` the row the algorithm in recserve/embedding/__init__.py's docstring
  defines (splitmix64 streams, Box-Muller in double, rounded to float32), derived here
  from that text alone, in numpy (`default_rows`); for `{"rows": file}` row key mod k
  (Python's floor modulo) of the [k, D] .npy file, read here with numpy;
- ids [B] give [B, D]; ids [B, L] give [B, L, D] with combiner none, else are pooled over
  the non-padding ids: sum, mean (sum / count), sqrtn (sum / sqrt(count)); no ids -> zeros
  ([B] ids with a pooling combiner act like [B, 1]); float32 sums in id order, as the
  engine documents, so results can match bit for bit;
- tensors of the version's dense.safetensors replace graph initializers of the same name;
- a table named after a 2-D initializer that no binding uses (a plain ONNX model's
  embedding) overwrites that initializer's rows at its keys (row indices);
- deltas (`.incremental_ckpt`/`.incremental_checkpoint`) are applied in step order when
  `apply_deltas` is set: within a delta, `deleted` keys are removed first, then rows upserted.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import safetensors.numpy
import xxhash
from onnx import numpy_helper

from recserve.model_spec import EmbeddingBinding, ModelSpec, parse_model_spec

__all__ = ["Reference", "default_rows", "reference_predict", "splitmix64"]

_DELTA_DIRS = (".incremental_ckpt", ".incremental_checkpoint")


class Reference:
    """A model version loaded once for many reference predictions. Not thread-safe.

    `model_dir` is a savedmodel dir or a demo dir holding `model/`; `checkpoint_dir` is a
    version dir (it has MANIFEST.json), a parent of versions (the highest global_step is
    used), or None (graph values only)."""

    def __init__(
        self,
        model_dir: str | os.PathLike[str],
        checkpoint_dir: str | os.PathLike[str] | None,
        *,
        apply_deltas: bool = True,
    ) -> None:
        root = Path(model_dir)
        if not (root / "model.onnx").exists() and (root / "model" / "model.onnx").exists():
            root = root / "model"
        model = onnx.load(str(root / "model.onnx"))
        self.spec = _read_spec(root, model)
        self._default_rows = {b.default.rows_file: np.load(root / b.default.rows_file).astype(np.float32)
                              for b in self.spec.embeddings if b.default.kind == "rows"}
        self.tables: dict[str, dict[int, np.ndarray]] = {}
        dense: dict[str, np.ndarray] = {}
        if checkpoint_dir is not None:
            version = _pick_version(Path(checkpoint_dir))
            self.tables = {name: rows for name, (rows, _) in _read_tables(version).items()}
            dense = _read_dense(version)
            if apply_deltas:
                for delta in _deltas(version):
                    for name, (rows, deleted) in _read_tables(delta).items():
                        table = self.tables.setdefault(name, {})
                        for key in deleted:
                            table.pop(key, None)
                        table.update(rows)
        _override_initializers(model, self.spec, self.tables, dense)
        self._graph_inputs = _graph_input_names(model)
        self._model = model
        self._session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    def predict(
        self, inputs: Mapping[str, Any], *, signature_name: str = "serving_default"
    ) -> dict[str, np.ndarray]:
        """Outputs keyed by signature alias for request `inputs` keyed by alias (or name)."""
        sig = _signature(self.spec, self._graph_inputs, self._model, signature_name)
        by_name = {sig["inputs"].get(k, k.split(":")[0]): v for k, v in inputs.items()}
        feeds: dict[str, np.ndarray] = {}
        for b in self.spec.embeddings:
            feeds[b.graph_input] = _lookup(b, by_name[b.input], self.tables.get(b.table, {}),
                                           self._default_rows.get(b.default.rows_file))
        for name, elem_type in self._graph_inputs.items():
            if name not in feeds:
                dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
                feeds[name] = np.asarray(by_name[name]).astype(dtype)
        aliases = list(sig["outputs"])
        values = self._session.run([sig["outputs"][a] for a in aliases], feeds)
        return dict(zip(aliases, values))


def reference_predict(
    model_dir: str | os.PathLike[str],
    checkpoint_dir: str | os.PathLike[str] | None,
    inputs: Mapping[str, Any],
    *,
    signature_name: str = "serving_default",
    apply_deltas: bool = True,
) -> dict[str, np.ndarray]:
    """One-shot `Reference(model_dir, checkpoint_dir).predict(inputs)`."""
    return Reference(model_dir, checkpoint_dir, apply_deltas=apply_deltas).predict(
        inputs, signature_name=signature_name
    )


def _read_spec(model_dir: Path, model: onnx.ModelProto) -> ModelSpec:
    if (model_dir / "model.json").exists():
        return parse_model_spec((model_dir / "model.json").read_bytes())
    for prop in model.metadata_props:
        if prop.key == "recserve":
            return parse_model_spec(prop.value)
    return ModelSpec()


def _pick_version(path: Path) -> Path:
    if (path / "MANIFEST.json").exists():
        return path
    steps = []
    for child in path.iterdir():
        manifest = child / "MANIFEST.json"
        if not child.name.startswith(".") and manifest.exists():
            doc = json.loads(manifest.read_text())
            if doc["kind"] == "full":
                steps.append((doc["global_step"], child.name, child))
    if not steps:
        raise FileNotFoundError(f"no version with a MANIFEST.json in {path}")
    return max(steps)[2]


def _deltas(version: Path) -> list[Path]:
    found = []
    for dir_name in _DELTA_DIRS:
        parent = version / dir_name
        if parent.is_dir():
            for child in parent.iterdir():
                if (child / "MANIFEST.json").exists():
                    found.append((json.loads((child / "MANIFEST.json").read_text())["global_step"],
                                  str(child), child))
    return [path for _, _, path in sorted(found)]


def _manifest_files(version: Path) -> list[str]:
    return list(json.loads((version / "MANIFEST.json").read_text())["files"])


def _read_tables(version: Path) -> dict[str, tuple[dict[int, np.ndarray], list[int]]]:
    """table -> (key -> row, deleted keys)."""
    tables = {}
    for name in _manifest_files(version):
        if name.startswith("embedding/") and name.endswith(".safetensors"):
            t = safetensors.numpy.load_file(version / name)
            rows = dict(zip(t["keys"].tolist(), t["values"]))
            deleted = t["deleted"].tolist() if "deleted" in t else []
            tables[name[len("embedding/") : -len(".safetensors")]] = (rows, deleted)
    return tables


def _read_dense(version: Path) -> dict[str, np.ndarray]:
    if "dense.safetensors" in _manifest_files(version):
        return safetensors.numpy.load_file(version / "dense.safetensors")
    return {}


def _override_initializers(
    model: onnx.ModelProto,
    spec: ModelSpec,
    tables: Mapping[str, Mapping[int, np.ndarray]],
    dense: Mapping[str, np.ndarray],
) -> None:
    bound = {b.table for b in spec.embeddings}
    for i, init in enumerate(model.graph.initializer):
        value = None
        if init.name in dense:
            value = np.asarray(dense[init.name])
        if init.name in tables and init.name not in bound and len(init.dims) == 2:
            value = numpy_helper.to_array(init).copy() if value is None else value.copy()
            for key, row in tables[init.name].items():
                value[key] = row
        if value is not None:
            old = numpy_helper.to_array(init)
            if value.shape != old.shape or value.dtype != old.dtype:
                raise ValueError(
                    f"{init.name}: checkpoint value {value.dtype}{list(value.shape)} does not "
                    f"match the graph's {old.dtype}{list(old.shape)}"
                )
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(value, init.name))


def _graph_input_names(model: onnx.ModelProto) -> dict[str, int]:
    initializers = {t.name for t in model.graph.initializer}
    return {i.name: i.type.tensor_type.elem_type for i in model.graph.input
            if i.name not in initializers}


def _signature(
    spec: ModelSpec, graph_inputs: Mapping[str, int], model: onnx.ModelProto, name: str
) -> dict[str, dict[str, str]]:
    if spec.signatures is not None:
        sig = spec.signatures[name]
        return {"inputs": dict(sig.inputs), "outputs": dict(sig.outputs)}
    fed = {b.graph_input for b in spec.embeddings}
    request = [n for n in graph_inputs if n not in fed] + [b.input for b in spec.embeddings]
    return {"inputs": {n: n for n in request},
            "outputs": {o.name: o.name for o in model.graph.output}}


def _keys(binding: EmbeddingBinding, ids: Any) -> np.ndarray:
    if binding.key_dtype == "int64":
        ints = np.asarray(ids).astype(np.int64)
        if not binding.vocabulary:
            return ints
        index = {word: binding.vocabulary_start + i for i, word in enumerate(binding.vocabulary) if word is not None}
        return np.array([-1 if i == -1 and binding.empty_is_padding else index.get(i, binding.default_id)
                         for i in ints.reshape(-1).tolist()], dtype=np.int64).reshape(ints.shape)
    arr = np.asarray(ids, dtype=object)
    flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in arr.reshape(-1)]
    from recserve.embedding._purekeys import fingerprint64

    padding = binding.empty_is_padding
    if binding.vocabulary:
        position = {word.encode("utf-8"): binding.vocabulary_start + i for i, word in enumerate(binding.vocabulary)
                    if word is not None}

        def key(v: bytes) -> int:
            if not v and padding:
                return -1
            if v in position:
                return position[v]
            if binding.oov_buckets:
                return binding.oov_start + fingerprint64(v) % binding.oov_buckets
            return binding.default_id

        hashed = [key(v) for v in flat]
    elif binding.buckets:
        hashed = [fingerprint64(v) % binding.buckets if v or not padding else -1 for v in flat]
    else:
        hashed = [np.uint64(xxhash.xxh64_intdigest(v, seed=0)).view(np.int64) if v else -1
                  for v in flat]
    return np.array(hashed, dtype=np.int64).reshape(arr.shape)


def _lookup(binding: EmbeddingBinding, ids: Any, table: Mapping[int, np.ndarray],
            default_matrix: np.ndarray | None) -> np.ndarray:
    keys = _keys(binding, ids)
    flat = keys.reshape(-1)
    rows = np.zeros((flat.size, binding.dim), dtype=np.float32)
    unknown = []
    for i, key in enumerate(flat.tolist()):
        if key == -1:
            continue
        if key in table:
            rows[i] = table[key]
        else:
            unknown.append(i)
    if unknown and binding.default.kind == "normal":
        rows[unknown] = default_rows(binding.default.stddev, binding.default.seed, flat[unknown], binding.dim)
    if unknown and default_matrix is not None:
        for i in unknown:
            rows[i] = default_matrix[int(flat[i]) % len(default_matrix)]
    rows = rows.reshape(*keys.shape, binding.dim)
    if binding.combiner == "none":
        return rows
    if keys.ndim == 1:
        keys, rows = keys[:, None], rows[:, None]
    # Like the engine: float32 sums in id order from +0.0; padding rows are zeros.
    total = np.zeros((keys.shape[0], binding.dim), dtype=np.float32)
    for position in range(keys.shape[1]):
        total += rows[:, position]
    count = (keys != -1).sum(axis=1).astype(np.float32)[:, None]
    if binding.combiner == "sum":
        return total
    divisor = count if binding.combiner == "mean" else np.sqrt(count)
    pooled: np.ndarray = np.divide(total, divisor, out=np.zeros_like(total), where=count > 0)
    return pooled


# -- default rows: the documented algorithm (recserve/embedding/__init__.py) -------------

_U64 = 2**64


def splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output for state x (uint64 array; arithmetic wraps modulo 2**64)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def default_rows(stddev: float, seed: int, keys: np.ndarray, dim: int) -> np.ndarray:
    """[len(keys), dim] float32: the `{"normal": stddev, seed}` default row of each key."""
    keys = np.asarray(keys, dtype=np.int64).reshape(-1)
    seed_state = splitmix64(np.array([seed % _U64], dtype=np.uint64))
    stream = splitmix64(seed_state ^ keys.view(np.uint64))
    pairs = (dim + 1) // 2
    offsets = np.arange(2 * pairs, dtype=np.uint64)
    draws = splitmix64(stream[:, None] + offsets[None, :])
    u1 = ((draws[:, 0::2] >> np.uint64(11)) + np.uint64(1)).astype(np.float64) * 2.0**-53  # (0, 1]
    u2 = (draws[:, 1::2] >> np.uint64(11)).astype(np.float64) * 2.0**-53  # [0, 1)
    rows = np.empty((len(keys), 2 * pairs), dtype=np.float64)
    # The C library's log/cos/sin (Python's math), as the docstring says both engines use;
    # numpy's own vectorised ones may differ in a double's last bit.
    for i, j in np.ndindex(u1.shape):
        radius = math.sqrt(-2.0 * math.log(float(u1[i, j])))
        theta = 6.283185307179586 * float(u2[i, j])
        rows[i, 2 * j] = stddev * (radius * math.cos(theta))
        rows[i, 2 * j + 1] = stddev * (radius * math.sin(theta))
    return rows[:, :dim].astype(np.float32)
