"""What `model.json` says: sparse-feature bindings and serving signatures (DESIGN §4).

The same document may live in the ONNX model's ``metadata_props`` under key ``"recserve"``.
Parsing is strict: an unknown key or a bad value raises ``ModelLoadError`` naming it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Literal

import numpy as np

from recserve.errors import ModelLoadError

__all__ = [
    "COMBINERS",
    "DefaultSpec",
    "EmbeddingBinding",
    "ModelSpec",
    "SignatureSpec",
    "parse_model_spec",
]

COMBINERS = ("none", "sum", "mean", "sqrtn")
KEY_DTYPES = ("int64", "string")
KEY_HASHES = ("xxh64", "farmhash64_mod", "vocabulary")
KEY_HASH_TF = "farmhash64_mod"
KEY_HASH_VOCABULARY = "vocabulary"
Combiner = Literal["none", "sum", "mean", "sqrtn"]


@dataclass(frozen=True)
class DefaultSpec:
    """The vector an unknown key gets: zeros; N(0, stddev) drawn deterministically from
    (seed, key) so every replica and every call returns the same vector; or row key mod k of
    a float32 [k, dim] matrix (DeepRec's Embedding Variable default_value), stored in the
    model dir as the .npy file `rows_file` names.

    `matrix` holds that file's contents once the model dir is read
    (recserve.model_store.default_rows); it takes no part in comparisons: two specs naming
    the same file are the same default."""

    kind: Literal["zeros", "normal", "rows"] = "zeros"
    stddev: float = 0.0
    seed: int = 0
    rows_file: str = ""
    matrix: np.ndarray | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> Any:
        if self.kind == "zeros":
            return "zeros"
        if self.kind == "rows":
            return {"rows": self.rows_file}
        return {"normal": self.stddev, "seed": self.seed}

    @classmethod
    def from_json(cls, value: Any, where: str) -> DefaultSpec:
        if value == "zeros":
            return cls()
        if isinstance(value, dict) and set(value) <= {"normal", "seed"} and "normal" in value:
            stddev, seed = value["normal"], value.get("seed", 0)
            if isinstance(stddev, (int, float)) and stddev >= 0 and isinstance(seed, int):
                return cls(kind="normal", stddev=float(stddev), seed=seed)
        if isinstance(value, dict) and set(value) == {"rows"} and _relative_path(value["rows"]):
            return cls(kind="rows", rows_file=value["rows"])
        raise ModelLoadError(
            f"{where}: 'default' is {value!r}; valid values are \"zeros\", "
            '{"normal": <stddev >= 0>, "seed": <int>} or {"rows": "<.npy file of float32 [k, dim], a path '
            'relative to the model dir>"}'
        )


def _relative_path(path: Any) -> bool:
    """A path inside the model dir: relative, without '..' (a model dir is self-contained)."""
    return isinstance(path, str) and bool(path) and not PurePosixPath(path).is_absolute() and \
        "\\" not in path and ".." not in PurePosixPath(path).parts


@dataclass(frozen=True)
class EmbeddingBinding:
    """Request input `input` (ids) is looked up in `table` and feeds graph input `graph_input`."""

    input: str
    table: str
    dim: int
    graph_input: str
    combiner: Combiner = "none"
    key_dtype: Literal["int64", "string"] = "int64"
    default: DefaultSpec = field(default_factory=DefaultSpec)
    # String keys: 0 = XXH64 (recserve's own hash); N > 0 = TensorFlow's StringToHashBucketFast
    # into N buckets ("key_hash": "farmhash64_mod"), what a converted SavedModel's hashed
    # columns do.
    buckets: int = 0
    # String keys that are `vocabulary_start` + their index in this list ("key_hash":
    # "vocabulary"): a converted SavedModel's vocabulary columns and Keras StringLookup layers.
    # A string not in it gets `oov_start + Fingerprint64 % oov_buckets` when oov_buckets > 0
    # (num_oov_buckets, num_oov_indices > 1), else `default_id` (-1: dropped, as padding).
    # With key_dtype "int64" the list holds integer ids (integer vocabulary columns, Keras
    # IntegerLookup; no oov_buckets), and `empty_is_padding` False looks id -1 up like any id.
    vocabulary: tuple[str | int | None, ...] = ()  # None: an id no string has (a gap)
    vocabulary_start: int = 0
    default_id: int = -1
    oov_buckets: int = 0
    oov_start: int = 0
    # '' is padding (feature columns drop it); False: '' is hashed or looked up like any
    # string (Keras's Hashing and StringLookup layers).
    empty_is_padding: bool = True
    # The table is a TensorFlow variable partitioned in parts of these row counts, saved as
    # their concatenation and looked up with partition_strategy 'mod': row r of part k holds
    # id r * len(parts) + k (model_store.table_data.mod_partition_ids). Empty: row i is id i.
    mod_partitions: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        hashing: dict[str, Any] = {"key_hash": KEY_HASH_TF, "buckets": self.buckets} if self.buckets else {}
        if self.vocabulary:
            hashing = {"key_hash": KEY_HASH_VOCABULARY, "vocabulary": list(self.vocabulary)}
            options = {"vocabulary_start": (self.vocabulary_start, 0), "default_id": (self.default_id, -1),
                       "oov_buckets": (self.oov_buckets, 0), "oov_start": (self.oov_start, 0)}
            hashing |= {key: value for key, (value, unset) in options.items() if value != unset}
        if not self.empty_is_padding:
            hashing["empty_is_padding"] = False
        if self.mod_partitions:
            hashing["mod_partitions"] = list(self.mod_partitions)
        return hashing | {
            "input": self.input,
            "table": self.table,
            "dim": self.dim,
            "combiner": self.combiner,
            "graph_input": self.graph_input,
            "key_dtype": self.key_dtype,
            "default": self.default.to_json(),
        }


@dataclass(frozen=True)
class SignatureSpec:
    """Alias -> graph/request tensor name, for inputs and for outputs."""

    inputs: dict[str, str]
    outputs: dict[str, str]


@dataclass(frozen=True)
class ModelSpec:
    embeddings: tuple[EmbeddingBinding, ...] = ()
    # None: derive `serving_default` from the graph (DESIGN §4).
    signatures: dict[str, SignatureSpec] | None = None
    # TensorFlow checkpoints (DESIGN §4b): table or ONNX initializer -> the TF name holding
    # its rows (an Embedding Variable) or value (a dense variable); unmapped: its own name.
    checkpoint_names: dict[str, str] = field(default_factory=dict)

    def checkpoint_name(self, name: str) -> str:
        return self.checkpoint_names.get(name, name)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"embeddings": [b.to_json() for b in self.embeddings]}
        if self.checkpoint_names:
            doc["checkpoint_names"] = dict(self.checkpoint_names)
        if self.signatures is not None:
            doc["signatures"] = {
                name: {"inputs": dict(s.inputs), "outputs": dict(s.outputs)}
                for name, s in self.signatures.items()
            }
        return doc

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)


_VOCABULARY_OPTIONS = {"vocabulary_start": 0, "default_id": -1, "oov_buckets": 0, "oov_start": 0}
_BINDING_KEYS = {"input", "table", "dim", "combiner", "graph_input", "key_dtype", "default", "key_hash", "buckets",
                 "vocabulary", "empty_is_padding", "mod_partitions", *_VOCABULARY_OPTIONS}


def _parse_binding(raw: Any, where: str) -> EmbeddingBinding:
    if not isinstance(raw, dict):
        raise ModelLoadError(f"{where}: expected an object, got {type(raw).__name__}")
    unknown = set(raw) - _BINDING_KEYS
    if unknown:
        raise ModelLoadError(
            f"{where}: unknown key(s) {sorted(unknown)}; valid keys are {sorted(_BINDING_KEYS)}"
        )
    for key in ("input", "table", "dim"):
        if key not in raw:
            raise ModelLoadError(f"{where}: missing required key {key!r}")
    if not isinstance(raw["input"], str) or not isinstance(raw["table"], str):
        raise ModelLoadError(f"{where}: 'input' and 'table' must be strings")
    dim = raw["dim"]
    if not isinstance(dim, int) or isinstance(dim, bool) or dim <= 0:
        raise ModelLoadError(f"{where}: 'dim' is {dim!r}; it must be a positive integer")
    combiner = raw.get("combiner", "none")
    if combiner not in COMBINERS:
        raise ModelLoadError(f"{where}: 'combiner' is {combiner!r}; valid values are {list(COMBINERS)}")
    key_dtype = raw.get("key_dtype", "int64")
    if key_dtype not in KEY_DTYPES:
        raise ModelLoadError(f"{where}: 'key_dtype' is {key_dtype!r}; valid values are {list(KEY_DTYPES)}")
    key_hash = raw.get("key_hash", "xxh64")
    buckets = raw.get("buckets", 0)
    if key_hash not in KEY_HASHES:
        raise ModelLoadError(f"{where}: 'key_hash' is {key_hash!r}; valid values are {list(KEY_HASHES)}")
    if key_hash == KEY_HASH_TF:
        if key_dtype != "string" or not isinstance(buckets, int) or isinstance(buckets, bool) or buckets <= 0:
            raise ModelLoadError(f"{where}: 'key_hash' {KEY_HASH_TF!r} needs 'key_dtype' \"string\" and 'buckets' "
                                 f"a positive integer; got key_dtype {key_dtype!r}, buckets {buckets!r}")
    elif "buckets" in raw:
        raise ModelLoadError(f"{where}: 'buckets' goes with 'key_hash' {KEY_HASH_TF!r}")
    vocabulary = raw.get("vocabulary", [])
    if key_hash == KEY_HASH_VOCABULARY and key_dtype == "int64":
        if not isinstance(vocabulary, list) or not any(_is_int(w) for w in vocabulary) or \
                not all(w is None or _is_int(w) for w in vocabulary) or raw.get("oov_buckets", 0):
            raise ModelLoadError(f"{where}: 'key_hash' {KEY_HASH_VOCABULARY!r} with 'key_dtype' \"int64\" needs "
                                 "'vocabulary' a non-empty list of integers (null: a key no id has) and no "
                                 "'oov_buckets'")
        outside = next((w for w in vocabulary if w is not None and not _INT64_MIN <= w <= _INT64_MAX), None)
        if outside is not None:
            raise ModelLoadError(f"{where}: 'vocabulary' holds the id {outside}, outside int64 "
                                 f"[{_INT64_MIN}, {_INT64_MAX}]: requests' ids are int64")
    elif key_hash == KEY_HASH_VOCABULARY:
        if key_dtype != "string" or not isinstance(vocabulary, list) or \
                not any(isinstance(w, str) for w in vocabulary) or \
                not all(w is None or isinstance(w, str) for w in vocabulary):
            raise ModelLoadError(f"{where}: 'key_hash' {KEY_HASH_VOCABULARY!r} needs 'key_dtype' \"string\" and "
                                 "'vocabulary' a non-empty list of strings (null: an id no string has)")
    else:
        for key in ("vocabulary", *_VOCABULARY_OPTIONS):
            if key in raw:
                raise ModelLoadError(f"{where}: {key!r} goes with 'key_hash' {KEY_HASH_VOCABULARY!r}")
    options = {key: raw.get(key, unset) for key, unset in _VOCABULARY_OPTIONS.items()}
    for key, value in options.items():
        low = -1 if key == "default_id" else 0
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= _INT64_MAX:
            raise ModelLoadError(f"{where}: {key!r} is {value!r}; it must be an integer >= {low} and <= {_INT64_MAX}")
    last_key = options["vocabulary_start"] + len(vocabulary) - 1 if key_hash == KEY_HASH_VOCABULARY else 0
    if last_key > _INT64_MAX:
        raise ModelLoadError(f"{where}: 'vocabulary_start' {options['vocabulary_start']} + {len(vocabulary)} "
                             f"vocabulary entries gives keys beyond int64's {_INT64_MAX}")
    empty_is_padding = raw.get("empty_is_padding", True)
    if not isinstance(empty_is_padding, bool) or (not empty_is_padding and key_hash == "xxh64"):
        raise ModelLoadError(f"{where}: 'empty_is_padding' is {empty_is_padding!r}; it is true or false, and false "
                             f"goes with 'key_hash' {KEY_HASH_TF!r} or {KEY_HASH_VOCABULARY!r}")
    partitions = raw.get("mod_partitions", [])
    if not isinstance(partitions, list) or len(partitions) == 1 or \
            not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in partitions):
        raise ModelLoadError(f"{where}: 'mod_partitions' is {partitions!r}; it lists the row counts (positive "
                             "integers) of the table's 2 or more partitions, in partition order")
    graph_input = raw.get("graph_input", raw["input"])
    if not isinstance(graph_input, str):
        raise ModelLoadError(f"{where}: 'graph_input' must be a string")
    return EmbeddingBinding(
        input=raw["input"],
        table=raw["table"],
        dim=dim,
        graph_input=graph_input,
        combiner=combiner,
        key_dtype=key_dtype,
        default=DefaultSpec.from_json(raw.get("default", "zeros"), where),
        buckets=buckets if key_hash == KEY_HASH_TF else 0,
        vocabulary=tuple(vocabulary) if key_hash == KEY_HASH_VOCABULARY else (),
        empty_is_padding=empty_is_padding,
        mod_partitions=tuple(partitions),
        **options,
    )


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_name_map(raw: Any, where: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise ModelLoadError(f"{where}: expected an object mapping alias -> tensor name")
    return dict(raw)


def parse_model_spec(text: str | bytes, source: str = "model.json") -> ModelSpec:
    """Parse and validate a model.json document; `source` names it in error messages."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested too deeply
        raise ModelLoadError(f"{source}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise ModelLoadError(f"{source}: expected a JSON object")
    unknown = set(doc) - {"embeddings", "signatures", "checkpoint_names"}
    if unknown:
        raise ModelLoadError(
            f"{source}: unknown key(s) {sorted(unknown)}; valid keys are ['checkpoint_names', 'embeddings', "
            "'signatures']"
        )
    raw_bindings = doc.get("embeddings", [])
    if not isinstance(raw_bindings, list):
        raise ModelLoadError(f"{source}: 'embeddings' must be a list")
    bindings = tuple(
        _parse_binding(raw, f"{source}: embeddings[{i}]") for i, raw in enumerate(raw_bindings)
    )
    for attr in ("input", "graph_input"):
        names = [getattr(b, attr) for b in bindings]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ModelLoadError(f"{source}: {attr} {twice} bound more than once")
    first: dict[str, EmbeddingBinding] = {}
    for b in bindings:
        other = first.setdefault(b.table, b)
        if (other.dim, other.default, other.mod_partitions) != (b.dim, b.default, b.mod_partitions):
            raise ModelLoadError(
                f"{source}: table {b.table!r} is bound by {other.input!r} and {b.input!r} with "
                "different 'dim', 'default' or 'mod_partitions'; bindings sharing a table must agree on them"
            )
    signatures: dict[str, SignatureSpec] | None = None
    if "signatures" in doc:
        raw_sigs = doc["signatures"]
        if not isinstance(raw_sigs, dict) or not raw_sigs:
            raise ModelLoadError(f"{source}: 'signatures' must be a non-empty object")
        signatures = {}
        for name, raw in raw_sigs.items():
            where = f"{source}: signatures[{name!r}]"
            if not isinstance(raw, dict) or set(raw) - {"inputs", "outputs"}:
                raise ModelLoadError(f"{where}: expected an object with 'inputs' and 'outputs'")
            signatures[name] = SignatureSpec(
                inputs=_parse_name_map(raw.get("inputs", {}), f"{where}.inputs"),
                outputs=_parse_name_map(raw.get("outputs", {}), f"{where}.outputs"),
            )
    names = doc.get("checkpoint_names", {})
    if not isinstance(names, dict) or not all(isinstance(k, str) and isinstance(v, str) and k and v
                                              for k, v in names.items()):
        raise ModelLoadError(f"{source}: 'checkpoint_names' must map table or initializer names to TensorFlow "
                             'variable names, e.g. {"user": "input_layer/user_emb/embedding_weights"}')
    return ModelSpec(embeddings=bindings, signatures=signatures, checkpoint_names=dict(names))
