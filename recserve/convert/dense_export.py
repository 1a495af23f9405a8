"""The dense rest of a SavedModel's serving graph, to ONNX through tf2onnx (DESIGN §4c).

Each lookup's cut tensor becomes a float32 graph input (a weighted lookup's: its weighted
pooling of the engine's unpooled rows, with the weights input as a graph input too); what
only fed the lookups (the ids' hashing and padding, the gathers, DeepRec's EV ops that
TensorFlow could not even import)
is pruned away with every control edge (Asserts do not serve); the variables still read are
frozen to constants from the SavedModel's `variables/` bundle (recserve's own reader, sliced
tensors included). tf2onnx then converts what is left; graph inputs and outputs get the
TensorFlow tensor names without ':0', and each initializer of a variable's value takes that
variable's name, so a checkpoint's dense variables override it by name (DESIGN §4b).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recserve.convert.savedmodel_graph import VARIABLE_OPS, Lookup, node_name, tensor_name
from recserve.errors import ModelLoadError
from recserve.model_store.tensor_bundle import TensorBundle

__all__ = ["ONNX_OPSET", "dense_graph", "lookup_input", "output_name", "to_onnx"]

ONNX_OPSET = 17
_DT_FLOAT = 1
_DT_RESOURCE = 20


def lookup_input(lookup: Lookup) -> str:
    """The ONNX graph input a lookup's rows feed."""
    return f"{lookup.table}/lookup:{lookup.input}"


def _placeholder(graph_def: Any, name: str, dim: int, rank: int) -> Any:
    node = graph_def.node.add()
    node.name, node.op = name, "Placeholder"
    node.attr["dtype"].type = _DT_FLOAT
    shape = node.attr["shape"].shape
    for _ in range(rank - 1):
        shape.dim.add().size = -1
    shape.dim.add().size = dim
    return node


def dense_graph(graph_def: Any, lookups: Sequence[Lookup], outputs: Sequence[str],
                variables: str, keys: Mapping[str, str] | None = None) -> tuple[Any, dict[str, str]]:
    """A copy of `graph_def` cut at the lookups, pruned to `outputs`, variables frozen from
    bundle prefix `variables` (variable `v` read as key `keys[v]`, else as `v`). Returns the
    new GraphDef and, for each tensor holding a variable's value (the Const, its reads),
    that variable's name."""
    out = copy.deepcopy(graph_def)
    cuts = {lk.cut: _weighted_pooling_name(lk) if lk.weights else _placeholder_name(lk) for lk in lookups}
    for node in out.node:
        node.input[:] = [cuts.get(tensor_name(ref), ref) for ref in node.input if not ref.startswith("^")]
    for lk in lookups:
        if lk.weights:
            nodes = {n.name: n for n in graph_def.node}
            out.node.extend(_weighted_pooling(lk, nodes[lk.input], nodes[lk.weights]))
        else:
            _placeholder(out, _placeholder_name(lk), lk.dim, lk.rank)
    by_name = {n.name: n for n in out.node}
    keep: set[str] = set()
    stack = [node_name(o) for o in outputs]
    while stack:
        name = stack.pop()
        if name in keep:
            continue
        if name not in by_name:
            raise ModelLoadError(f"the serving graph reads {name!r}, which it does not define")
        keep.add(name)
        stack.extend(node_name(r) for r in by_name[name].input)
    pruned = [n for n in out.node if n.name in keep]
    del out.node[:]
    out.node.extend(pruned)
    return out, _freeze(out, variables, keys or {})


def _placeholder_name(lookup: Lookup) -> str:
    return f"recserve_lookup/{lookup.input}"


def _weighted_pooling_name(lookup: Lookup) -> str:
    return f"recserve_weighted/{lookup.input}/pooled"


def _weighted_pooling(lookup: Lookup, ids: Any, weights: Any) -> list[Any]:
    """The nodes pooling a weighted lookup's unpooled rows ([batch, L, dim], or [batch, dim]
    for ids [batch]: L = 1) with its weights input (the signature's placeholder `weights`) as
    TensorFlow's embedding_lookup_sparse does: sum(w * row) over the ids; mean divides by
    sum(w), sqrtn by sqrt(sum(w^2)), both over the ids whose weight is > 0 only
    (safe_embedding_lookup_sparse drops the others, ids and weights); padding ids have zero
    rows; a sample left without ids pools to zeros (div_no_nan). Built by TensorFlow itself,
    in a graph of its own, and grafted in: the rows placeholder (the ids' shape + [dim]) is
    the lookup's graph input."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        ids_shape = [d.size if d.size >= 0 else None for d in ids.attr["shape"].shape.dim]  # rows and weights: the same L
        rows = tf1.placeholder(tf.float32, ids_shape + [lookup.dim], name=_placeholder_name(lookup))
        w = tf1.placeholder(tf.as_dtype(weights.attr["dtype"].type), None, name=lookup.weights)
        with tf1.name_scope(f"recserve_weighted/{lookup.input}/"):
            w = tf.cast(w, tf.float32)
            if lookup.rank == 2:  # ids [batch]: one id per sample
                rows, w = tf.expand_dims(rows, 1), tf.expand_dims(w, 1)
            if lookup.combiner != "sum":  # only sum keeps the ids of weight <= 0
                w = tf.where(w > 0, w, tf.zeros_like(w))
            pooled = tf.reduce_sum(rows * tf.expand_dims(w, -1), axis=1)
            if lookup.combiner == "mean":
                pooled = tf.math.divide_no_nan(pooled, tf.reduce_sum(w, axis=1, keepdims=True))
            elif lookup.combiner == "sqrtn":
                pooled = tf.math.divide_no_nan(pooled, tf.sqrt(tf.reduce_sum(w * w, axis=1, keepdims=True)))
        tf.identity(pooled, name=_weighted_pooling_name(lookup))
    return [node for node in graph.as_graph_def().node if node.name != lookup.weights]


def _freeze(graph_def: Any, variables: str, keys: Mapping[str, str]) -> dict[str, str]:
    """Variables -> Const of their saved value; ReadVariableOp -> Identity of that Const."""
    from tensorflow.python.framework import tensor_util

    bundle = TensorBundle(variables)
    holds: dict[str, str] = {}
    try:
        for node in graph_def.node:
            if node.op in VARIABLE_OPS:
                key = keys.get(node.name, node.name)
                if key not in bundle.entries:
                    raise ModelLoadError(f"variable {node.name!r} of the dense graph is not in {variables} "
                                         f"(looked for {key!r})")
                value = np.array(bundle.read(key))
                dtype = node.attr["dtype"].type
                node.op = "Const"
                for key in list(node.attr):
                    del node.attr[key]
                node.attr["dtype"].type = dtype
                node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value))
                holds[f"{node.name}:0"] = node.name
            elif node.op == "ReadVariableOp":
                dtype = node.attr["dtype"].type
                node.op = "Identity"
                for key in list(node.attr):
                    del node.attr[key]
                node.attr["T"].type = dtype
        _retype_handles(graph_def, holds)
        for _ in range(2):  # a variable's read (VariableV2's `/read`, a ReadVariableOp) holds its value too
            for node in graph_def.node:
                if node.op == "Identity" and tensor_name(node.input[0]) in holds:
                    holds[f"{node.name}:0"] = holds[tensor_name(node.input[0])]
    finally:
        bundle.close()
    return holds


def _retype_handles(graph_def: Any, frozen: dict[str, str]) -> None:
    """Identities that passed a variable's handle (an inlined function's resource argument)
    pass its frozen value now: their type becomes the value's."""
    by_name = {n.name: n for n in graph_def.node}
    dtypes = {name.split(":")[0]: by_name[name.split(":")[0]].attr["dtype"].type for name in frozen}
    changed = True
    while changed:
        changed = False
        for node in graph_def.node:
            if node.op == "Identity" and node.attr["T"].type == _DT_RESOURCE and node_name(node.input[0]) in dtypes:
                node.attr["T"].type = dtypes[node.name] = dtypes[node_name(node.input[0])]
                changed = True


def to_onnx(graph_def: Any, lookups: Sequence[Lookup], inputs: Sequence[str], outputs: Mapping[str, str],
            holds: dict[str, str]) -> Any:
    """tf2onnx's ModelProto of the dense graph: inputs = the dense signature inputs and one
    per lookup (`lookup_input`), named without ':0'; `outputs`: the graph's output tensors ->
    their ONNX names; initializers holding a variable's value renamed to the variable."""
    import tf2onnx

    rename = {tensor_name(i): node_name(i) for i in inputs}
    rename |= {f"{_placeholder_name(lk)}:0": lookup_input(lk) for lk in lookups}
    rename |= {tensor_name(o): name for o, name in outputs.items()}
    model, _ = tf2onnx.convert.from_graph_def(
        graph_def, input_names=[tensor_name(i) for i in inputs] + [f"{_placeholder_name(lk)}:0" for lk in lookups],
        output_names=[tensor_name(o) for o in outputs], opset=ONNX_OPSET, tensors_to_rename=rename)
    _name_initializers(model, holds)
    return model


def output_name(tensor: str) -> str:
    """The ONNX output of TF tensor `x:0` is `x`; of `x:k` (k > 0), `x_k`."""
    full = tensor_name(tensor)
    return node_name(full) if full.endswith(":0") else full.replace(":", "_")


def _name_initializers(model: Any, holds: dict[str, str]) -> None:
    """Initializer `<read>:0` -> its variable's name (the first one, when several hold it)."""
    renames: dict[str, str] = {}
    taken = {i.name for i in model.graph.initializer}
    for init in model.graph.initializer:
        variable = holds.get(init.name)
        if variable is not None and variable != init.name and variable not in taken:
            renames[init.name] = variable
            taken.add(variable)
    for init in model.graph.initializer:
        init.name = renames.get(init.name, init.name)
    for node in model.graph.node:
        node.input[:] = [renames.get(i, i) for i in node.input]

