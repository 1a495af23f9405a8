"""Finding the embedding lookups of a SavedModel's serving graph (DESIGN §4c).

Works on the GraphDef as protobuf only — no op is executed or even registered — so graphs
holding DeepRec's Embedding Variable ops (which TensorFlow cannot import) are read too.

A lookup is a gather on a variable — `GatherV2`/`Gather` on a `VariableV2` read,
`ResourceGather` on a `VarHandleOp`, DeepRec's `KvResourceGather[V1]` on a `KvVarHandleOp`;
a partitioned variable is one gather per `part_<k>`, all feeding one `(Parallel)DynamicStitch`
— followed by its pooling (`SparseSegmentSum/Mean/SqrtN`), or by nothing (one row per id).
Its *cut* is the tensor where the lookup's own subgraph ends: starting at the pooling (or
the gather), the region grows through every consumer computed only from the ids input, the
variable and constants (TF1 feature columns' empty-row zeroing `Tile`/`ZerosLike`/`Select`
and reshapes); the one tensor of the region read from outside it is the cut. recserve's
engine computes exactly that tensor: [batch, dim], `combiner` over the non-padding ids ('' or
-1), zeros for a sample without ids. The ids' path says how ids become keys:
`StringToHashBucketFast` (Fingerprint64 mod buckets), a vocabulary table (string_ids.py), or
the int64 ids themselves. A weighted lookup (`weighted_categorical_column`) is computed from a
float weights input too: rows times weights, `SegmentSum`, divided for mean / sqrtn; its cut
is found the same way, and the dense graph pools the engine's unpooled rows (dense_export.py).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from recserve.convert.string_ids import integer_ids, string_ids
from recserve.errors import ModelLoadError

__all__ = ["Lookup", "ServingGraph", "find_lookups"]

VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp", "KvVarHandleOp"})
EV_OPS = frozenset({"KvVarHandleOp"})
GATHER_OPS = frozenset({"GatherV2", "Gather", "ResourceGather", "KvResourceGather", "KvResourceGatherV1"})
POOLING = {
    "SparseSegmentSum": "sum", "SparseSegmentMean": "mean", "SparseSegmentSqrtN": "sqrtn",
    "SparseSegmentSumWithNumSegments": "sum", "SparseSegmentMeanWithNumSegments": "mean",
    "SparseSegmentSqrtNWithNumSegments": "sqrtn",
}
STITCH_OPS = frozenset({"ParallelDynamicStitch", "DynamicStitch"})
_READS = frozenset({"Identity", "ReadVariableOp"})
# Ops on an ids path recserve cannot reproduce yet: refused by name rather than served wrong.
_UNSUPPORTED_ID_OPS = {
    "LookupTableFind": "a TF1 v1 lookup table (LookupTableFind)",
    "StringToHashBucketStrong": "keyed hashing (StringToHashBucketStrong, Keras Hashing with a salt)",
    "StringToHashBucket": "the legacy StringToHashBucket hash",
    "AsString": "ids hashed as strings (categorical_column_with_hash_bucket on integers)",
}
_PART = re.compile(r"/part_\d+$")


def node_name(ref: str) -> str:
    """'^x' or 'x:1' -> 'x'."""
    return ref.lstrip("^").split(":")[0]


def tensor_name(ref: str) -> str:
    """'x' -> 'x:0'; 'x:1' stays."""
    return ref if ":" in ref else f"{ref}:0"


@dataclass(frozen=True)
class Lookup:
    """One embedding lookup: request input `input` -> table `table` -> tensor `cut`."""

    input: str                 # the signature's placeholder (node name) holding the ids
    table: str                 # the variable's name, partitions merged ('.../part_0' -> '...')
    parts: tuple[str, ...]     # the variable nodes, in partition order
    dim: int
    rows: int | None           # rows of a plain variable (all partitions); None for an EV
    combiner: str              # sum / mean / sqrtn / none
    key_dtype: str             # "string" or "int64"
    cut: str                   # the tensor the rest of the graph reads ('node:k')
    embedding_variable: bool   # a DeepRec Embedding Variable (keys are ids, rows from -keys/-values)
    # How strings become keys: EmbeddingBinding's buckets / vocabulary (+ options) /
    # empty_is_padding (string_ids.py); empty: int64 ids are the keys.
    ids_options: Mapping[str, Any] = field(default_factory=dict)
    rank: int = 2              # of the rows the engine gives: [batch, dim] pooled, ids' rank + 1 unpooled
    padded: bool = False       # the graph drops id -1 (SparseSegment pooling); else a gather reads it
    # A weighted lookup (weighted_categorical_column): the signature input holding one float
    # weight per id. The engine gives the rows unpooled; the dense graph pools them by
    # `combiner` with these weights (dense_export.py). Empty: not weighted.
    weights: str = ""
    # A partitioned variable looked up with partition_strategy 'mod': its parts' row counts
    # (EmbeddingBinding.mod_partitions). Empty: 'div', or one part.
    mod_partitions: tuple[int, ...] = ()

    @property
    def engine_combiner(self) -> str:
        """How recserve's engine pools the rows: a weighted lookup's are pooled by the dense graph."""
        return "none" if self.weights else self.combiner


class ServingGraph:
    """A GraphDef indexed for walking: nodes by name, data consumers, what each node reads."""

    def __init__(self, graph_def: Any, inputs: Iterable[str], outputs: Iterable[str]) -> None:
        self.nodes: dict[str, Any] = {n.name: n for n in graph_def.node}
        self.inputs = [node_name(i) for i in inputs]
        self.outputs = [tensor_name(o) for o in outputs]
        self.consumers: dict[str, list[Any]] = {}
        for node in graph_def.node:
            for ref in node.input:
                if not ref.startswith("^"):
                    self.consumers.setdefault(node_name(ref), []).append(node)
        self.needed = self._ancestors([node_name(o) for o in self.outputs])
        self._sources: dict[str, frozenset[str]] = {}

    def _ancestors(self, start: list[str]) -> set[str]:
        seen: set[str] = set()
        stack = list(start)
        while stack:
            name = stack.pop()
            if name in seen or name not in self.nodes:
                continue
            seen.add(name)
            stack.extend(node_name(r) for r in self.nodes[name].input if not r.startswith("^"))
        return seen

    def sources(self, name: str) -> frozenset[str]:
        """The placeholders and variables `name` is computed from (data edges)."""
        if name in self._sources:
            return self._sources[name]
        stack = [name]
        while stack:
            top = stack[-1]
            if top in self._sources:
                stack.pop()
                continue
            node = self.nodes[top]
            deps = [node_name(r) for r in node.input if not r.startswith("^")]
            missing = [d for d in deps if d not in self._sources and d in self.nodes]
            if missing:
                stack.extend(missing)
                continue
            own = {top} if node.op == "Placeholder" or node.op in VARIABLE_OPS else set()
            self._sources[top] = frozenset(own.union(*(self._sources.get(d, frozenset()) for d in deps)))
            stack.pop()
        return self._sources[name]

    def variable_of(self, ref: str) -> Any | None:
        """The variable node a gather's params come from (through reads), or None."""
        node = self.nodes.get(node_name(ref))
        while node is not None and node.op in _READS:
            node = self.nodes.get(node_name(node.input[0]))
        return node if node is not None and node.op in VARIABLE_OPS else None


def _shape(node: Any) -> list[int]:
    attr = node.attr["shape"].shape
    return [d.size for d in attr.dim]


def _forward(graph: ServingGraph, start: Any, allowed: frozenset[str], limit: int = 8) -> Any | None:
    """The first pooling op within `limit` consumers of `start`, staying inside `allowed`."""
    frontier = [start]
    for _ in range(limit):
        following = []
        for node in frontier:
            for consumer in graph.consumers.get(node.name, []):
                if consumer.op in POOLING:
                    return consumer
                if consumer.name in graph.needed and graph.sources(consumer.name) <= allowed:
                    following.append(consumer)
        frontier = following
    return None


_RESHAPES = frozenset({"Identity", "Reshape"})


_FOLDED_REDUCTIONS = {"Mean": "mean", "Sum": "sum"}


def _unpooled_cut(graph: ServingGraph, start: Any, allowed: frozenset[str], ids_rank: int) -> tuple[str, str]:
    """(cut, combiner) of a lookup without pooling: cut right after its gather (or stitch),
    past reshapes only: whatever else follows (a mean over a sequence, ...) stays in the dense
    graph — except a Mean or Sum over the sequence axis of [batch, L] ids right after the
    gather (Keras's GlobalAveragePooling1D), which the engine pools itself (combiner mean/sum:
    the same rows, added in id order)."""
    node, reshaped = start, False
    while True:
        following = [c for c in graph.consumers.get(node.name, []) if c.name in graph.needed]
        if len(following) == 1 and not reshaped and ids_rank == 2 and following[0].op in _FOLDED_REDUCTIONS:
            reduce = following[0]
            axis = _int_value(graph, reduce.input[1])
            if axis in (1, -2) and not reduce.attr["keep_dims"].b and node_name(reduce.input[0]) == node.name:
                return tensor_name(reduce.name), _FOLDED_REDUCTIONS[reduce.op]
        if len(following) != 1 or following[0].op not in _RESHAPES or not graph.sources(following[0].name) <= allowed:
            return tensor_name(node.name), "none"
        reshaped = reshaped or following[0].op != "Identity"
        node = following[0]


def _int_value(graph: ServingGraph, ref: str) -> int | None:
    """A scalar (or one-element) integer constant `ref` holds, through Identity nodes."""
    node = graph.nodes.get(node_name(ref))
    while node is not None and node.op == "Identity":
        node = graph.nodes.get(node_name(node.input[0]))
    if node is None or node.op != "Const":
        return None
    tensor = node.attr["value"].tensor
    values = list(tensor.int_val) or list(tensor.int64_val)
    return values[0] if len(values) == 1 else None


def _cut(graph: ServingGraph, start: Any, allowed: frozenset[str], table: str) -> str:
    region = {start.name}
    stack = [start]
    while stack:
        node = stack.pop()
        for consumer in graph.consumers.get(node.name, []):
            if consumer.name not in region and consumer.name in graph.needed and \
                    graph.sources(consumer.name) <= allowed:
                region.add(consumer.name)
                stack.append(consumer)
    read_outside = {tensor_name(ref) for name in graph.needed - region for ref in graph.nodes[name].input
                    if not ref.startswith("^") and node_name(ref) in region}
    read_outside |= {o for o in graph.outputs if node_name(o) in region}
    if len(read_outside) != 1:
        raise ModelLoadError(f"the lookup of {table!r} is read by the rest of the graph through "
                             f"{sorted(read_outside) or 'nothing'}; recserve cuts a lookup at exactly one tensor")
    return read_outside.pop()


def _id_path_ops(graph: ServingGraph, start: Any, ids: str) -> list[Any]:
    """Ops between the ids placeholder and `start` (those computed from the ids)."""
    return [graph.nodes[n] for n in graph._ancestors([start.name])
            if n != ids and ids in graph.sources(n) and not graph.variable_of(n)]


def find_lookups(graph: ServingGraph, placeholders: Mapping[str, Any],
                 warnings: list[str] | None = None, assets: Mapping[str, str] | None = None) -> list[Lookup]:
    """Every embedding lookup the signature's outputs depend on. `placeholders`: the
    signature's input node names -> their TensorInfo (dtype). What recserve serves
    differently from TensorFlow on some inputs is appended to `warnings`. `assets`: the
    SavedModel's asset files (tensor name and file name -> path), for vocabulary files."""
    warnings = [] if warnings is None else warnings
    groups: dict[str, list[tuple[Any, Any]]] = {}   # pooling / stitch / gather node -> (gather, variable)
    for name in sorted(graph.needed):
        node = graph.nodes[name]
        if node.op not in GATHER_OPS:
            continue
        variable = graph.variable_of(node.input[0])
        if variable is None:
            continue
        consumers = graph.consumers.get(name, [])
        stitch = next((c for c in consumers if c.op in STITCH_OPS), None)
        head = stitch or node
        pooling = _forward(graph, head, graph.sources(head.name) | {variable.name})
        groups.setdefault((pooling or head).name, []).append((node, variable))
    lookups = []
    for key, members in groups.items():
        variables = sorted({v.name: v for _, v in members}.values(), key=lambda v: v.name)
        tables = {_PART.sub("", v.name) for v in variables}
        if len(tables) != 1:
            raise ModelLoadError(f"one lookup ({key!r}) reads several variables {sorted(tables)}")
        table = tables.pop()
        start = graph.nodes[key]
        sources = graph.sources(key)
        ids, weights = _ids_and_weights(graph, sorted(s for s in sources if graph.nodes[s].op == "Placeholder"),
                                        placeholders, table)
        path = _id_path_ops(graph, start, ids[0])
        for op in path:
            if op.op in _UNSUPPORTED_ID_OPS:
                raise ModelLoadError(f"the lookup of {table!r} uses {_UNSUPPORTED_ID_OPS[op.op]} (op {op.name!r}), "
                                     "which recserve does not convert yet")
        is_string = placeholders[ids[0]].dtype == 7  # DT_STRING
        if is_string:
            ids_options = string_ids(graph, path, table, assets or {})
        elif any(op.op in ("StringToHashBucketFast", "LookupTableFindV2") for op in path):
            ids_options = integer_ids(graph, path, table)
        else:
            ids_options = {}
        kinds = {op.op for op in path}
        never_negative = bool(ids_options.get("vocabulary")) and ids_options.get("default_id", -1) >= 0 \
            and ids_options.get("empty_is_padding") is False  # an integer vocabulary keys every id >= 0
        if not is_string and not never_negative and {"Less", "SelectV2"} <= kinds \
                and kinds & {"Add", "AddV2"}:  # where(i<0, i+rows, i)
            warnings.append(f"the lookup of {table!r} reads a negative id as counted from the table's end (Keras's "
                            "take); recserve answers zeros for negative ids (padding, left out of a pooled mean)")
        elif any(op.op == "LogicalAnd" and not _reads_weights(graph, op, weights) for op in path) \
                and any(op.op in ("Select", "SelectV2") for op in path):
            warnings.append(f"the lookup of {table!r} replaces ids outside its range by a default id "
                            "(categorical_column_with_identity's default_value); recserve answers zeros for them")
        ev = variables[0].op in EV_OPS
        shapes = [_shape(v) for v in _in_part_order(variables)]
        mod = len(variables) > 1 and not ev and any(op.op == "DynamicPartition" for op in path) \
            and not any(op.op == "Maximum" for op in path)
        if mod:
            _check_mod_partitions([s[0] for s in shapes], table)
        dim = shapes[0][-1]
        rows = None if ev else sum(s[0] for s in shapes)
        combiner = POOLING.get(start.op, "none")
        allowed = frozenset({ids[0], *(v.name for v in variables), *weights})
        if weights:
            combiner = _weighted_combiner(graph, start, allowed, table)
            _check_weighted(ids_options, combiner, _rank(placeholders[ids[0]]), table)
            cut = _cut(graph, start, allowed, table)
        elif combiner != "none":
            cut = _cut(graph, start, allowed, table)
        else:
            cut, combiner = _unpooled_cut(graph, start, allowed, _rank(placeholders[ids[0]]))
        lookups.append(Lookup(
            input=ids[0], table=table, parts=tuple(v.name for v in _in_part_order(variables)), dim=dim, rows=rows,
            combiner=combiner, key_dtype="string" if is_string else "int64", ids_options=ids_options,
            cut=cut, embedding_variable=ev,
            rank=_rank(placeholders[ids[0]]) + 1 if combiner == "none" or weights else 2,
            padded=start.op in POOLING or bool(weights), weights=weights[0] if weights else "",
            mod_partitions=tuple(s[0] for s in shapes) if mod else ()))
    inputs = [lk.input for lk in lookups]
    twice = sorted({i for i in inputs if inputs.count(i) > 1})
    if twice:
        raise ModelLoadError(f"input(s) {twice} feed more than one lookup; recserve binds an input to one table")
    return lookups


_FLOATS = frozenset({1, 2})  # DT_FLOAT, DT_DOUBLE
_DIVISIONS = frozenset({"DivNoNan", "RealDiv", "Div"})


def _ids_and_weights(graph: ServingGraph, inputs: list[str], placeholders: Mapping[str, Any], table: str
                     ) -> tuple[list[str], list[str]]:
    """([the ids input], [its weights input] or []) of a lookup computed from `inputs`: one
    input, or the ids (integers or strings) and float weights of a weighted_categorical_column
    (embedding_lookup_sparse's sp_weights)."""
    refused = (f"the lookup of {table!r} reads the inputs {inputs}; recserve converts lookups of one signature "
               "input, or of one ids input and one float weights input (weighted_categorical_column); crossed "
               "columns are not converted yet")
    if not inputs or len(inputs) > 2 or any(name not in placeholders for name in inputs):
        raise ModelLoadError(refused)
    if len(inputs) == 1:
        return inputs, []
    weights = [name for name in inputs if placeholders[name].dtype in _FLOATS]
    if len(weights) != 1:
        raise ModelLoadError(refused)
    return [name for name in inputs if name != weights[0]], weights


def _reads_weights(graph: ServingGraph, op: Any, weights: list[str]) -> bool:
    """Whether `op` is computed from the weights input (a weighted lookup's pruning of ids,
    `ids >= 0 and ones_like(weights)`, is not an identity column's range check)."""
    return any(w in graph.sources(op.name) for w in weights)


def _weighted_combiner(graph: ServingGraph, start: Any, allowed: frozenset[str], table: str) -> str:
    """sum / mean / sqrtn of embedding_lookup_sparse's weighted pooling after the gather
    `start`: rows times weights, `SegmentSum`, then divided by the segment sum of the
    weights (mean) or by its `Sqrt` over the squared weights (sqrtn)."""
    ops: set[str] = set()
    stack, seen = [start], {start.name}
    while stack:
        node = stack.pop()
        for consumer in graph.consumers.get(node.name, []):
            if consumer.name not in seen and consumer.name in graph.needed and graph.sources(consumer.name) <= allowed:
                seen.add(consumer.name)
                ops.add(consumer.op)
                stack.append(consumer)
    if "SegmentSum" not in ops or "Mul" not in ops:
        raise ModelLoadError(f"the lookup of {table!r} reads a weights input, but its rows are not pooled as "
                             "embedding_lookup_sparse pools weighted ids (rows times weights, SegmentSum); found "
                             f"{sorted(ops)}")
    divisions = [graph.nodes[name] for name in seen if graph.nodes[name].op in _DIVISIONS]
    if not divisions:
        return "sum"
    divisors = {graph.nodes[name].op for d in divisions for name in graph._ancestors([node_name(d.input[1])])}
    return "sqrtn" if divisors & {"Sqrt", "Rsqrt"} else "mean"


def _check_weighted(ids_options: Mapping[str, Any], combiner: str, ids_rank: int, table: str) -> None:
    """What the dense graph's weighted pooling cannot reproduce, refused by name."""
    if ids_rank not in (1, 2):
        raise ModelLoadError(f"the weighted lookup of {table!r} has ids of rank {ids_rank}; recserve converts "
                             "weighted ids of shape [batch] or [batch, L]")
    if combiner != "sum" and ids_options.get("vocabulary") and ids_options.get("default_id") == -1 \
            and not ids_options.get("oov_buckets"):
        raise ModelLoadError(f"the weighted lookup of {table!r} drops unknown words (a vocabulary with default_value "
                             f"-1) and pools by {combiner}: TensorFlow leaves their weights out of the divisor, and "
                             "recserve's dense graph cannot tell a dropped word from a known one; give the vocabulary "
                             "num_oov_buckets or a default_value >= 0, or pool by sum")


def _check_mod_partitions(sizes: list[int], table: str) -> None:
    """partition_strategy 'mod' reads id i at row i // P of part i % P: every part must hold
    the rows of its ids below the variable's row count (fixed_size_partitioner's sizes do)."""
    rows, parts = sum(sizes), len(sizes)
    want = [(rows - k + parts - 1) // parts for k in range(parts)]
    if sizes != want:
        raise ModelLoadError(f"the partitioned variable {table!r} is looked up with partition_strategy 'mod' but its "
                             f"parts hold {sizes} rows; ids 0..{rows - 1} by 'mod' need {want}")


def _rank(info: Any) -> int:
    if info.tensor_shape.unknown_rank:
        raise ModelLoadError(f"input {info.name!r} has no known rank; recserve needs it for an unpooled lookup")
    return len(info.tensor_shape.dim)


def _in_part_order(variables: list[Any]) -> list[Any]:
    def index(v: Any) -> int:
        match = re.search(r"/part_(\d+)$", v.name)
        return int(match.group(1)) if match else 0
    return sorted(variables, key=index)
