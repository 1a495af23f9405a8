"""What a DeepRec Embedding Variable answers for an id it never stored, read from the graph
and computed once in the conversion process (TensorFlow is there).

DeepRec's `KvResourceGather` (tensorflow/core/kernels/kv_variable_ops.cc) takes a missing
id's row from:
- with `is_use_default_value_tensor` false — `embedding_lookup` without `ev_init_value`, the
  usual graph — the EV's own default matrix, row `id % default_value_dim`
  (embedding_var.h). That matrix is the `value` input of the EV's `InitializeKvVariableOp`
  (its initializer's output, [default_value_dim, dim]); the gather's own default_value
  input is then a dummy scalar 1.0.
- with `is_use_default_value_tensor` true (`ev_init_value`): row *i* of the gather's
  default_value tensor for the id at position i of the batch — not a function of the id.

A matrix whose subgraph reads no placeholder and no variable is evaluated once in
TensorFlow: all zeros keeps the "zeros" default, anything else becomes a `{"rows": file}`
default (recserve.model_spec.DefaultSpec) the converted dir carries. What cannot be computed
(a feed or a variable on the way, a per-position default, partitions of one EV with
different matrices) stays zeros and is said aloud as a warning naming the EV.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from recserve.convert.savedmodel_graph import EV_OPS, VARIABLE_OPS, Lookup, ServingGraph, node_name, tensor_name
from recserve.model_spec import DefaultSpec

__all__ = ["DEFAULTS_DIR", "ev_defaults"]

DEFAULTS_DIR = "defaults"  # in the converted model dir: <DEFAULTS_DIR>/<table>.npy
_FEEDS = frozenset({"Placeholder", "PlaceholderWithDefault", "PlaceholderV2"})
_GATHERS = ("KvResourceGather",)
_INITIALIZE = "InitializeKvVariable"  # InitializeKvVariableOp, InitializeKvVariableV2Op


def _file_name(table: str) -> str:
    return f"{DEFAULTS_DIR}/{re.sub(r'[^A-Za-z0-9_.-]', '_', table)}.npy"


def _evaluate(graph_def: Any, ref: str) -> np.ndarray | str:
    """The value of tensor `ref`, computed by TensorFlow from its own subgraph; or why not."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    try:
        sub = tf1.graph_util.extract_sub_graph(graph_def, [node_name(ref)])
    except (AssertionError, ValueError, KeyError) as exc:
        return f"its subgraph cannot be cut out ({exc})"
    for node in sub.node:
        if node.op in _FEEDS or node.op in VARIABLE_OPS or node.op.startswith("Kv") or "Variable" in node.op:
            return f"it reads {node.op} {node.name!r}"
    try:
        with tf.Graph().as_default() as graph:
            tf.import_graph_def(sub, name="")
            with tf1.Session(graph=graph) as session:
                return np.asarray(session.run(tensor_name(ref)))
    except Exception as exc:  # noqa: BLE001  (an op TF lacks, a failing kernel: reported, not fatal)
        return f"TensorFlow cannot compute it ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"


def _part_default(graph: ServingGraph, graph_def: Any, part: str, dim: int) -> np.ndarray | str:
    """One EV partition's default matrix [k, dim] as DeepRec's gather reads it; or why not."""
    gathers = [n for n in graph.nodes.values() if n.op.startswith(_GATHERS) and len(n.input) > 2
               and (v := graph.variable_of(n.input[0])) is not None and v.name == part]
    per_position = [g for g in gathers if g.attr["is_use_default_value_tensor"].b]
    if per_position:
        return (f"its gather {per_position[0].name!r} reads default_value {per_position[0].input[2]!r} by the id's "
                "position in the batch (is_use_default_value_tensor, ev_init_value), not by id")
    inits = [n for n in graph.nodes.values() if n.op.startswith(_INITIALIZE) and len(n.input) > 2
             and (v := graph.variable_of(n.input[0])) is not None and v.name == part]
    if not inits:
        return f"the graph has no {_INITIALIZE}Op for {part!r} to read its default matrix from"
    value = _evaluate(graph_def, inits[0].input[2])
    if isinstance(value, str):
        return f"its default matrix {inits[0].input[2]!r} cannot be computed without serving: {value}"
    if value.ndim != 2 or value.shape[1] != dim or value.shape[0] < 1 or value.dtype.kind != "f":
        return f"its default matrix {inits[0].input[2]!r} is {value.dtype} {list(value.shape)}, not [k, {dim}]"
    declared = inits[0].attr["default_value_dim"].i if "default_value_dim" in inits[0].attr else value.shape[0]
    if declared != value.shape[0]:
        return (f"its default_value_dim {declared} differs from its default matrix's {value.shape[0]} rows "
                f"({inits[0].input[2]!r})")
    return value.astype(np.float32)


def ev_defaults(graph: ServingGraph, graph_def: Any, lookups: list[Lookup]) -> tuple[dict[str, DefaultSpec], list[str]]:
    """Per EV table: its default (zeros, or the rows DeepRec answers from), and a warning for
    each EV whose default recserve cannot reproduce (it then answers zeros)."""
    defaults: dict[str, DefaultSpec] = {}
    warnings: list[str] = []
    for lookup in lookups:
        if not lookup.embedding_variable or not all(
                graph.nodes.get(p) is not None and graph.nodes[p].op in EV_OPS for p in lookup.parts):
            continue
        matrices = [_part_default(graph, graph_def, part, lookup.dim) for part in lookup.parts]
        why = next((m for m in matrices if isinstance(m, str)), None)
        if why is None and any(not np.array_equal(m, matrices[0]) for m in matrices[1:]):
            why = "its partitions have different default matrices"
        if why is not None:
            warnings.append(f"Embedding Variable {lookup.table!r}: DeepRec answers an id it never stored with a "
                            f"default row; recserve answers zeros: {why}")
            continue
        matrix = matrices[0]
        assert isinstance(matrix, np.ndarray)
        if matrix.any():
            name = _file_name(lookup.table)
            while name in {d.rows_file for d in defaults.values()}:  # two tables, one sanitized name
                name = name.removesuffix(".npy") + "_.npy"
            defaults[lookup.table] = DefaultSpec(kind="rows", rows_file=name, matrix=matrix)
    return defaults, warnings
