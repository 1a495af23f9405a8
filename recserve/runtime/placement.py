"""Device placement for plain ONNX models: embedding tables move out of the graph into
recserve's CPU embedding engine (`enable_device_placement_optimization`, DESIGN §4).

An embedding layer is a `Gather` (axis 0) whose data is a 2-D float initializer: what
`nn.Embedding` exports to with either torch exporter, and what the dynamo exporter's
`nn.EmbeddingBag` starts with. The rewrite gives:
- a dense graph in which each such Gather's output is a new graph input, fed with the
  rows the engine looks up; the tables and the id arithmetic are gone from it;
- inside Loop/If bodies (the TorchScript exporter's `nn.EmbeddingBag`), a Gather whose
  ids are `Slice(v)` of a main-graph value `v` becomes the same `Slice` of the rows of
  `v`, which the engine looks up once per request (Gather and Slice along axis 0
  commute);
- a CPU "ids" graph computing every looked-up id tensor from the request inputs, when
  the ids are not request inputs themselves (casts and slices of a float input, as CTR
  libraries export), extracted with onnx-ir, which keeps Loop bodies' outer-scope
  references intact.
A table some use of which cannot be rewritten (a Gather with another axis, a MatMul
sharing the weight, ids computed inside a body) stays in the graph, whole; `kept` says
why. Pure function over files; thread-safe.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as ir_passes
from onnx_ir.convenience import extract, get_const_tensor

from recserve.errors import ModelLoadError

__all__ = ["PlacedModel", "TableLookup", "place_embeddings"]


@dataclass(frozen=True)
class TableLookup:
    """Rows of `table` for the ids tensor `ids` feed dense graph input `graph_input`
    (shape ids.shape + [dim])."""

    graph_input: str
    table: str
    ids: str


@dataclass(frozen=True)
class PlacedModel:
    """The result of `place_embeddings`; immutable.

    `request_inputs` are the original graph's inputs (what requests send), with their
    dtypes and shapes (None: a free dimension) in `request_input_types`. Each
    `TableLookup.ids` is a request input of that name or an output of the ids graph
    (`ids_model_path`, run on the CPU with the request inputs listed in `ids_inputs`)."""

    dense_model_path: str
    tables: Mapping[str, np.ndarray]
    lookups: tuple[TableLookup, ...]
    request_inputs: tuple[str, ...]
    request_input_types: tuple[tuple[str, np.dtype[Any], tuple[int | None, ...]], ...]
    dense_request_inputs: tuple[str, ...]
    ids_model_path: str | None
    ids_inputs: tuple[str, ...]
    kept: Mapping[str, str] = field(default_factory=dict)


def _is_table(value: ir.Value | None, graph: ir.Graph) -> bool:
    if value is None or graph.initializers.get(value.name or "") is not value:
        return False
    tensor = value.const_value
    return tensor is not None and len(tensor.shape) == 2 and tensor.dtype in (ir.DataType.FLOAT,)


def _in_main(value: ir.Value, graph: ir.Graph) -> bool:
    producer = value.producer()
    return value.graph is graph if producer is None else producer.graph is graph


def _gather_axis(node: ir.Node) -> int:
    attr = node.attributes.get("axis")
    return 0 if attr is None else int(attr.as_int())


def _slice_of_main_value(ids: ir.Value, graph: ir.Graph) -> ir.Node | None:
    """The Slice producing `ids` if it slices a main-graph value along non-negative axes."""
    node = ids.producer()
    if node is None or node.op_type != "Slice" or node.domain not in ("", "ai.onnx"):
        return None
    data = node.inputs[0]
    if data is None or not _in_main(data, graph):
        return None
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        axes = get_const_tensor(node.inputs[3])
        if axes is None or (axes.numpy() < 0).any():
            return None
    return node


@dataclass
class _Use:
    node: ir.Node
    table: str
    ids: ir.Value  # a main-graph value whose rows are looked up
    via_slice: ir.Node | None  # set for uses inside a body


def _classify(graph: ir.Graph) -> tuple[dict[str, list[_Use]], dict[str, str]]:
    uses: dict[str, list[_Use]] = {}
    kept: dict[str, str] = {}
    tables = [
        name for name, value in graph.initializers.items()
        if _is_table(value, graph) and any(user.op_type == "Gather" and i == 0 for user, i in value.uses())
    ]
    for name in tables:
        for user, index in graph.initializers[name].uses():
            where = f"{user.op_type} node {user.name!r}"
            if user.op_type != "Gather" or user.domain not in ("", "ai.onnx") or index != 0:
                kept[name] = f"{where} uses it as input {index}, not as a Gather's data"
            elif _gather_axis(user) != 0:
                kept[name] = f"{where} gathers along axis {_gather_axis(user)}, not rows"
            elif user.graph is graph:
                uses.setdefault(name, []).append(_Use(user, name, user.inputs[1], None))  # type: ignore[arg-type]
            elif (slice_node := _slice_of_main_value(user.inputs[1], graph)) is not None:  # type: ignore[arg-type]
                uses.setdefault(name, []).append(_Use(user, name, slice_node.inputs[0], slice_node))  # type: ignore[arg-type]
            else:
                kept[name] = f"{where} inside a subgraph computes its ids there, not by slicing an outer value"
            if name in kept:
                break
    for name in kept:
        uses.pop(name, None)
    return uses, kept


def _input_type(value: ir.Value) -> tuple[str, np.dtype[Any], tuple[int | None, ...]]:
    if value.dtype is None:
        raise ModelLoadError(f"graph input {value.name!r} has no element type")
    dtype = value.dtype.numpy()
    dims = () if value.shape is None else tuple(d if isinstance(d, int) else None for d in value.shape.dims)
    return value.name or "", np.dtype(dtype), dims


def _rows_shape(ids: ir.Value, dim: int) -> ir.Shape | None:
    return None if ids.shape is None else ir.Shape([*ids.shape.dims, dim])


def _rewrite(graph: ir.Graph, uses: dict[str, list[_Use]]) -> list[TableLookup]:
    lookups: list[TableLookup] = []
    rows_inputs: dict[tuple[str, str], ir.Value] = {}
    for table, table_uses in sorted(uses.items()):
        dim = int(graph.initializers[table].const_value.shape[1])  # type: ignore[union-attr,arg-type]
        for use in table_uses:
            key = (table, use.ids.name or "")
            rows = rows_inputs.get(key)
            if rows is None or use.via_slice is None:
                name = use.node.outputs[0].name if use.via_slice is None else f"{use.ids.name}/{table}/rows"
                if use.via_slice is None:
                    use.node.outputs[0].name = f"{name}/replaced"
                rows = ir.Value(name=name, shape=_rows_shape(use.ids, dim), type=ir.TensorType(ir.DataType.FLOAT))
                graph.inputs.append(rows)
                rows_inputs.setdefault(key, rows)
                lookups.append(TableLookup(rows.name or "", table, use.ids.name or ""))
            body = use.node.graph
            assert body is not None
            if use.via_slice is None:
                use.node.outputs[0].replace_all_uses_with(rows, replace_graph_outputs=True)
            else:
                sliced = ir.node("Slice", [rows, *use.via_slice.inputs[1:]], name=f"{use.node.name}/rows")
                body.insert_before(use.node, sliced)
                use.node.outputs[0].replace_all_uses_with(sliced.outputs[0], replace_graph_outputs=True)
            body.remove(use.node, safe=True)
    return lookups


def _drop_unused_inputs(graph: ir.Graph) -> None:
    for value in list(graph.inputs):
        if not value.uses() and not value.is_graph_output():
            graph.inputs.remove(value)


def place_embeddings(model_path: str, out_dir: str) -> PlacedModel:
    """Move `model_path`'s embedding tables out of its graph; writes `dense.onnx` (and
    `ids.onnx` when ids are computed) into `out_dir`."""
    try:
        model = ir.load(model_path)
    except Exception as exc:  # onnx_ir raises DecodeError, OSError, ValueError...
        raise ModelLoadError(f"cannot read ONNX model {model_path}: {exc}") from exc
    graph = model.graph
    request_inputs = tuple(v.name or "" for v in graph.inputs)
    request_input_types = tuple(_input_type(v) for v in graph.inputs)
    uses, kept = _classify(graph)
    tables = {name: np.array(graph.initializers[name].const_value.numpy()) for name in uses}  # type: ignore[union-attr]
    computed = sorted({u.ids.name or "" for us in uses.values() for u in us} - set(request_inputs))
    os.makedirs(out_dir, exist_ok=True)
    ids_path: str | None = None
    ids_inputs: tuple[str, ...] = ()
    if computed:
        ids_path, ids_inputs = _write_ids_model(model_path, computed, os.path.join(out_dir, "ids.onnx"))
    lookups = _rewrite(graph, uses)
    ir_passes.RemoveUnusedNodesPass()(model)
    _drop_unused_inputs(graph)
    dense_path = os.path.join(out_dir, "dense.onnx")
    ir.save(model, dense_path)
    dense_inputs = {v.name for v in graph.inputs}
    return PlacedModel(
        dense_model_path=dense_path,
        tables=tables,
        lookups=tuple(lookups),
        request_inputs=request_inputs,
        request_input_types=request_input_types,
        dense_request_inputs=tuple(n for n in request_inputs if n in dense_inputs),
        ids_model_path=ids_path,
        ids_inputs=ids_inputs,
        kept=kept,
    )


def _write_ids_model(model_path: str, outputs: list[str], path: str) -> tuple[str, tuple[str, ...]]:
    """The CPU graph from the request inputs to the computed id tensors."""
    model = ir.load(model_path)
    graph = model.graph
    try:
        sub = extract(graph, inputs=list(graph.inputs), outputs=outputs)
    except ValueError as exc:
        raise ModelLoadError(f"cannot separate the embedding ids of {model_path} from its graph: {exc}") from exc
    _drop_unused_inputs(sub)
    ids_model = ir.Model(sub, ir_version=model.ir_version)
    ir.save(ids_model, path)
    return path, tuple(v.name or "" for v in sub.inputs)
