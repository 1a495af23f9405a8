"""`recserve convert --check N`: TensorFlow and recserve on N synthesized requests (DESIGN §4c).

Requests come from the signature: strings drawn from a few common words, '' (padding),
non-ASCII and never-seen ones; ids over the table's rows and -1; floats N(0, 1). TensorFlow
runs the SavedModel itself (`session.run`, as DeepRec and TF Serving do; a TF2 SavedModel
through `tf.saved_model.load`'s signature); recserve serves the
converted dir from the SavedModel's variables. Above TOLERANCE the conversion is refused,
naming the worst request's inputs. Runs in the conversion process (TensorFlow is there).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.errors import ModelLoadError

__all__ = ["TOLERANCE", "ParityReport", "check_parity", "synthesize_requests"]

TOLERANCE = 1e-5
_WORDS = ["", "a", "beijing", "杭州", "zürich", "x" * 80, "item-1", "click"]
_DT_STRING, _DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64 = 7, 1, 2, 3, 9


@dataclass(frozen=True)
class ParityReport:
    requests: int
    max_diff: float
    worst: Mapping[str, Any]
    skipped: str = ""  # why TensorFlow could not run the SavedModel (DeepRec's own ops)

    def summary(self) -> str:
        if self.skipped:
            return f"parity: not checked: {self.skipped}"
        return f"parity: {self.requests} requests, max |TensorFlow - recserve| = {self.max_diff:.3g}"


def _value(dtype: int, shape: tuple[int, ...], rows: tuple[int | None, int], rng: np.random.Generator,
           words: Sequence[int] = ()) -> np.ndarray:
    if words and dtype in (_DT_INT64, _DT_INT32):  # an integer vocabulary: its ids, unknown ones and -1
        known = np.array(words, dtype=np.int64)[rng.integers(len(words), size=shape)]
        other = rng.integers(-1, 1 << 20, shape)
        return np.where(rng.random(shape) < 0.6, known, other).astype(np.int64 if dtype == _DT_INT64 else np.int32)
    if dtype == _DT_STRING:
        words = [_WORDS[rng.integers(len(_WORDS))] if rng.random() < 0.6 else f"unseen-{rng.integers(1 << 40)}"
                 for _ in range(int(np.prod(shape)))]
        return np.array(words, dtype=object).reshape(shape)
    if dtype in (_DT_INT64, _DT_INT32):
        high, low = rows
        return rng.integers(low, high or 1 << 20, shape).astype(np.int64 if dtype == _DT_INT64 else np.int32)
    return rng.normal(0, 1, shape).astype(np.float64 if dtype == _DT_DOUBLE else np.float32)


def synthesize_requests(signature: Any, rows: Mapping[str, tuple[int | None, int]], n: int, seed: int = 0,
                        weights: Mapping[str, str] | None = None,
                        vocabularies: Mapping[str, Sequence[int]] | None = None) -> list[dict[str, np.ndarray]]:
    """`n` requests for a SignatureDef: batch 1 to 16, free dims 1 to 4. `rows`: input ->
    (the table's rows or None, the lowest id: -1 where it is padding, else 0). `weights`:
    weights input -> its ids input (a weighted lookup): the weights have the ids' shape, 0
    exactly where an id is padding (-1, ''), as TensorFlow pairs them. `vocabularies`: input
    -> its integer vocabulary's ids, drawn from beside unknown ids and -1."""
    vocabularies = vocabularies or {}
    rng = np.random.default_rng(seed)
    weights = weights or {}
    out = []
    for _ in range(n):
        batch = int(rng.integers(1, 17))
        request = {}
        names = {info.name.split(":")[0]: key for key, info in signature.inputs.items()}
        free: dict[str, int] = {}  # a free dim's size, shared by a weights input and its ids
        for key, info in sorted(signature.inputs.items(), key=lambda item: item[1].name.split(":")[0] in weights):
            name = info.name.split(":")[0]
            dims = [d.size for d in info.tensor_shape.dim]
            if name in weights and weights[name] in names:
                ids = request[names[weights[name]]]
                padding = ids == ("" if ids.dtype == object else -1)
                value = np.where(padding, 0.0, rng.uniform(0.05, 3.0, ids.shape) * rng.choice([-1.0, 1.0], ids.shape))
                request[key] = value.astype(np.float64 if info.dtype == _DT_DOUBLE else np.float32)
                continue
            shape = tuple(batch if i == 0 and d < 0 else (free.setdefault(name, int(rng.integers(1, 5))) if d < 0
                                                          else d) for i, d in enumerate(dims))
            request[key] = _value(info.dtype, shape, rows.get(name, (None, 0)), rng, vocabularies.get(name, ()))
        out.append(request)
    return out


def _tf_inputs(request: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.char.encode(v.astype(str), "utf-8") if v.dtype == object else v for k, v in request.items()}


class _TensorFlowRun:
    """TensorFlow running the SavedModel: a TF1 graph by `session.run` (as DeepRec and TF
    Serving do), a TF2 one (a function library) by `tf.saved_model.load`'s signature, which
    also runs what a session-style load cannot (Keras 3's `tf.saved_model.save`)."""

    def __init__(self, savedmodel_dir: str, signature_name: str, meta: Any) -> None:
        import tensorflow as tf

        from recserve.convert.savedmodel import SERVE_TAG

        self.signature = meta.signature_def[signature_name]
        self.keys = sorted(self.signature.outputs)
        self._session = None
        if meta.graph_def.library.function:
            self._function = tf.saved_model.load(savedmodel_dir, tags=[SERVE_TAG]).signatures[signature_name]
            return
        tf1 = tf.compat.v1
        graph = tf.Graph()
        config = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        self._session = tf1.Session(graph=graph, config=config)
        with graph.as_default():
            tf1.saved_model.loader.load(self._session, [SERVE_TAG], savedmodel_dir)
        self._fetches = [graph.get_tensor_by_name(self.signature.outputs[k].name) for k in self.keys]
        self._feeds = {k: graph.get_tensor_by_name(info.name) for k, info in self.signature.inputs.items()}

    def run(self, request: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        inputs = _tf_inputs(request)
        if self._session is None:
            import tensorflow as tf

            out = self._function(**{k: tf.constant(v) for k, v in inputs.items()})
            return [out[k].numpy() for k in self.keys]
        return self._session.run(self._fetches, {self._feeds[k]: v for k, v in inputs.items()})

    def close(self) -> None:
        if self._session is not None:
            self._session.close()


def check_parity(savedmodel_dir: str, converted_dir: str, signature_name: str, n: int,
                 padded: Mapping[str, bool] | None = None, weights: Mapping[str, str] | None = None) -> ParityReport:
    """TensorFlow vs the converted dir on `n` synthesized requests. `padded`: ids input ->
    whether the graph drops id -1 (the conversion's Lookup.padded); absent: where the
    binding pools. `weights`: weights input -> its ids input (Lookup.weights)."""
    import tensorflow as tf

    from recserve.convert.savedmodel import read_signature
    from recserve.convert.savedmodel_graph import EV_OPS
    from recserve.processor.processor import Processor

    meta, _, _ = read_signature(savedmodel_dir, signature_name)
    if any(node.op in EV_OPS for node in meta.graph_def.node):
        return ParityReport(0, 0.0, {}, "the graph holds DeepRec's Embedding Variable ops, which TensorFlow cannot run")
    rows = {node.name: [d.size for d in node.attr["shape"].shape.dim] for node in meta.graph_def.node
            if node.op in ("VariableV2", "VarHandleOp")}
    reference = _TensorFlowRun(savedmodel_dir, signature_name, meta)
    processor = None
    try:
        processor = Processor({"savedmodel_dir": converted_dir, "model_store_type": "local",
                               "signature_name": signature_name})
        lookups = {b.input: b for b in processor._model.spec.embeddings}
        # -1 is padding where the graph pools (feature columns drop it); a plain gather rejects it
        # (or, in Keras, reads the last row), even when the engine pools what follows it.
        drops = padded if padded is not None else {name: b.combiner != "none" for name, b in lookups.items()}
        table_rows = {name: (_rows(b.table, rows), -1 if drops.get(name) else 0) for name, b in lookups.items()}
        words = {name: [w for w in b.vocabulary if isinstance(w, int)] for name, b in lookups.items()
                 if b.key_dtype == "int64" and b.vocabulary}
        requests = synthesize_requests(reference.signature, table_rows, n, weights=weights, vocabularies=words)
        keys = reference.keys
        worst, worst_request = 0.0, {}
        for request in requests:
            try:
                want = reference.run(request)
            except tf.errors.OpError as exc:
                shown = {k: v.tolist() for k, v in request.items()}
                raise ModelLoadError(f"TensorFlow could not run a synthesized request ({exc.message.splitlines()[0]});"
                                     f" the request: {shown}") from exc
            got = processor.predict(request, keys)
            diff = max(float(np.max(np.abs(np.asarray(got[k], np.float64) - np.asarray(w, np.float64)),
                                    initial=0.0)) for k, w in zip(keys, want))
            if diff > worst or not worst_request:
                worst, worst_request = diff, request
    finally:
        if processor is not None:
            processor.close()
        reference.close()
    report = ParityReport(len(requests), worst, worst_request)
    if worst > TOLERANCE:
        shown = {k: v.tolist() for k, v in worst_request.items()}
        raise ModelLoadError(f"the conversion differs from TensorFlow by {worst:.3g} (> {TOLERANCE:g}); "
                             f"worst request: {shown}")
    return report


def _rows(table: str, shapes: Mapping[str, Sequence[int]]) -> int | None:
    parts = [s for name, s in shapes.items() if re.fullmatch(re.escape(table) + r"(/part_\d+)?", name)]
    return sum(s[0] for s in parts) if parts else None
