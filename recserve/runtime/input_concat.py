"""One graph input instead of many: a Concat of graph inputs folded out of the graph.

A DLRM-style graph starts by concatenating its dense features with every embedding's rows
(`Concat(dense, emb0, ..., emb25, axis=1)`). ONNX Runtime's `run` costs a few µs per graph
input (measured on the 429-512-256-1 MLP at batch 1: 66 µs with those 27 inputs, 43 µs with
the Concat's output as the one input; at batch 64, 634 vs 585 µs), more than one numpy
concatenate of the same arrays. So the session takes the Concat's output as a graph input
and `InputConcat.fold` builds it from the feeds the rest of recserve still computes by the
original names: signatures, routes and warmup files see the graph as it was written.

Pure functions and an immutable result; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx

__all__ = ["InputConcat", "fold_input_concat"]

# Fewer parts than this save less than the concatenate costs.
MIN_PARTS = 3


class InputConcat:
    """Graph inputs `parts` (rank 2, in column order) feed the new graph input `output`."""

    __slots__ = ("_part_set", "output", "parts")

    def __init__(self, output: str, parts: tuple[str, ...]) -> None:
        self.output = output
        self.parts = parts
        self._part_set = frozenset(parts)

    def fold(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The folded graph's feeds; raises ValueError when the parts' batch sizes differ."""
        folded = {name: value for name, value in feeds.items() if name not in self._part_set}
        folded[self.output] = np.concatenate([feeds[name] for name in self.parts], axis=1)
        return folded


def _uses(graph: onnx.GraphProto, counts: dict[str, int]) -> None:
    for node in graph.node:
        for name in node.input:
            counts[name] = counts.get(name, 0) + 1
        for attr in node.attribute:  # a body may read an outer value by name
            for body in [attr.g] if attr.HasField("g") else list(attr.graphs):
                _uses(body, counts)


def _rank2_type(value: onnx.ValueInfoProto) -> int | None:
    """The element type of a rank-2 tensor input with a static last dimension, else None."""
    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        return None
    shape = value.type.tensor_type.shape
    if len(shape.dim) != 2 or not shape.dim[1].HasField("dim_value"):
        return None
    return int(value.type.tensor_type.elem_type)


def fold_input_concat(model: onnx.ModelProto) -> InputConcat | None:
    """Rewrites `model` in place when its main graph has a Concat (axis 1) of at least
    MIN_PARTS graph inputs of one element type that nothing else reads, and says how to
    feed it; None (and `model` untouched) when there is none. The widest such Concat wins."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    inputs = {v.name: v for v in graph.input if v.name not in initializers}
    outputs = {v.name for v in graph.output}
    counts: dict[str, int] = {}
    _uses(graph, counts)
    best: Any = None
    for node in graph.node:
        if node.op_type != "Concat" or node.domain not in ("", "ai.onnx") or len(node.input) < MIN_PARTS:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), None)
        types = {_rank2_type(inputs[n]) if n in inputs else None for n in node.input}
        if (
            axis not in (1, -1)
            or None in types
            or len(types) != 1
            or len(set(node.input)) != len(node.input)
            or any(counts.get(n) != 1 or n in outputs for n in node.input)
            or node.output[0] in outputs
        ):
            continue
        if best is None or len(node.input) > len(best.input):
            best = node
    if best is None:
        return None
    parts = tuple(best.input)
    elem_type = _rank2_type(inputs[parts[0]])
    width = sum(inputs[n].type.tensor_type.shape.dim[1].dim_value for n in parts)
    batch = inputs[parts[0]].type.tensor_type.shape.dim[0]
    new_input = onnx.helper.make_tensor_value_info(
        best.output[0], elem_type, [batch.dim_value if batch.HasField("dim_value") else (batch.dim_param or None), width]
    )
    kept = [v for v in graph.input if v.name not in set(parts)]
    del graph.input[:]
    graph.input.extend([*kept, new_input])
    graph.node.remove(best)
    return InputConcat(best.output[0], parts)
