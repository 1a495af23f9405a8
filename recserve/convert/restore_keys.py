"""Which `variables/` bundle key each variable of a SavedModel is restored from (DESIGN §4c).

A TF1 SavedModel saves a variable under its own name. A TF2 one (`tf.saved_model.save`,
Keras's `export`) saves it under its object path (`variables/3/.ATTRIBUTES/VARIABLE_VALUE`)
while the graph's `VarHandleOp` has a name of its own (`item_emb/embeddings_1`). Two records
say which is which:
- the object graph, as `tf.saved_model.load` reads it: a top-level call's function is a
  saved concrete function whose `bound_inputs` (the call's last inputs) are object ids, and
  the bundle's `_CHECKPOINTABLE_OBJECT_GRAPH` gives each object's `VARIABLE_VALUE` key;
- the restore function, as TF Serving's session-style load runs it (the saver_def's restore
  op): `RestoreV2` reads key k and an `AssignVariableOp` stores it into the variable.
They agree when both name a variable, except that Keras 3's `tf.saved_model.save` restores
copies (`Variable_<k>`) and leaves the handles its functions read to the object graph (a
session-style load cannot run that model; `tf.saved_model.load` can): the object graph wins.
Read as protobuf only; the restore function from the inlined graph (function_inline.py).
"""

from __future__ import annotations

from typing import Any

from recserve.convert.savedmodel_graph import VARIABLE_OPS, node_name

__all__ = ["restore_keys"]

_OBJECT_GRAPH = "_CHECKPOINTABLE_OBJECT_GRAPH"
_ASSIGN_OPS = frozenset({"AssignVariableOp", "Assign"})


def _origin(nodes: dict[str, Any], ref: str) -> tuple[Any | None, int]:
    """The node (and output index) `ref` comes from, through Identity-like nodes."""
    name, _, index = ref.partition(":")
    node = nodes.get(node_name(name))
    while node is not None and node.op == "Identity":
        ref = node.input[0]
        name, _, index = ref.partition(":")
        node = nodes.get(node_name(name))
    return node, int(index or 0)


def object_graph_keys(meta: Any, bundle_prefix: str) -> dict[str, str]:
    """Variable node name (a top-level call's input) -> the bundle key of the object the
    saved concrete function binds it to."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    from recserve.model_store.tensor_bundle import TensorBundle

    functions = meta.object_graph_def.concrete_functions
    if not functions:
        return {}
    bundle = TensorBundle(bundle_prefix)
    try:
        if _OBJECT_GRAPH not in bundle.entries:
            return {}
        objects = trackable_object_graph_pb2.TrackableObjectGraph()
        objects.ParseFromString(bytes(bundle.read(_OBJECT_GRAPH).reshape(-1)[0]))
    finally:
        bundle.close()
    nodes = {n.name: n for n in meta.graph_def.node}
    out: dict[str, str] = {}
    for call in meta.graph_def.node:
        function = functions.get(call.attr["f"].func.name) if "f" in call.attr else None
        if function is None or not function.bound_inputs:
            continue
        data = [ref for ref in call.input if not ref.startswith("^")]
        for ref, object_id in zip(data[-len(function.bound_inputs):], function.bound_inputs):
            variable, _ = _origin(nodes, ref)
            if variable is None or variable.op not in VARIABLE_OPS or object_id >= len(objects.nodes):
                continue
            keys = [a.checkpoint_key for a in objects.nodes[object_id].attributes if a.name == "VARIABLE_VALUE"]
            if keys:
                out.setdefault(variable.name, keys[0])
    return out


def restore_keys(graph_def: Any) -> dict[str, str]:
    """Variable node name -> the bundle key its value is restored from (only those a
    RestoreV2 restores; a name missing here is read under its own name)."""
    nodes = {n.name: n for n in graph_def.node}
    out: dict[str, str] = {}
    for node in graph_def.node:
        if node.op not in _ASSIGN_OPS or len(node.input) < 2:
            continue
        variable, _ = _origin(nodes, node.input[0])
        source, index = _origin(nodes, node.input[1])
        if variable is None or variable.op not in VARIABLE_OPS or source is None or source.op != "RestoreV2":
            continue
        names, _ = _origin(nodes, source.input[1])
        if names is None or names.op != "Const":
            continue
        keys = names.attr["value"].tensor.string_val
        if index < len(keys):
            out.setdefault(variable.name, keys[index].decode("utf-8"))
    return out
