"""A TF2 SavedModel's graph with every function call inlined (DESIGN §4c).

`tf.saved_model.save`, Keras's `model.export` and `save_model(..., save_format='tf')` keep
the model in the GraphDef's function library: the top-level graph holds the signature's
placeholders, the variables (`VarHandleOp`), tables (`HashTableV2`) and constants, and a
`StatefulPartitionedCall` into `__inference_signature_wrapper_...`, which calls the model's
own function, and so on. TF Serving runs that graph as it is. recserve walks and cuts a flat
graph, so each call is replaced by its function's body: the body's nodes renamed
`<call>/<node>`, each argument an `Identity` of what the call was given (a resource argument
stays an Identity of the top-level `VarHandleOp`, which is how a lookup finds its variable),
and each read of the call's k-th output redirected to the body's k-th return tensor.
Function bodies name tensors `node:output_arg:index`; the op's registered OpDef (or the
called function's signature) turns that into GraphDef's `node:k`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from recserve.errors import ModelLoadError

__all__ = ["CALL_OPS", "inline_functions"]

CALL_OPS = frozenset({"StatefulPartitionedCall", "PartitionedCall"})
_DEPTH_LIMIT = 64  # nested calls deeper than this are a recursive function: refused


def _output_count(arg: Any, node: Any) -> int:
    """How many tensors one output arg of an OpDef stands for (TF's ComputeArgRange)."""
    if arg.number_attr:
        return node.attr[arg.number_attr].i
    if arg.type_list_attr:
        return len(node.attr[arg.type_list_attr].list.type)
    return 1


class _Inliner:
    def __init__(self, library: Any) -> None:
        self.functions = {f.signature.name: f for f in library.function}
        self.nodes: list[Any] = []
        self.redirect: dict[str, str] = {}  # '<call>:k' -> the body's return tensor

    def called(self, node: Any) -> Any | None:
        """The FunctionDef a node calls (a call op's `f`, or an op named after a function)."""
        if node.op in CALL_OPS:
            name = node.attr["f"].func.name
            if name not in self.functions:
                raise ModelLoadError(f"node {node.name!r} calls function {name!r}, which the SavedModel's "
                                     "library does not define")
            return self.functions[name]
        return self.functions.get(node.op)

    def output_args(self, node: Any) -> list[tuple[str, int]]:
        """(output arg name, tensor count) of a function-body node, in order."""
        function = self.functions.get(node.op)  # an op named after a function: its signature's outputs
        if function is not None:
            return [(a.name, 1) for a in function.signature.output_arg]
        from tensorflow.python.framework import op_def_registry

        op_def = op_def_registry.get(node.op)
        if op_def is None:
            raise ModelLoadError(f"op {node.op!r} (node {node.name!r}) is not a TensorFlow op this TensorFlow knows; "
                                 "recserve converts graphs of TensorFlow's own ops and DeepRec's Embedding Variables")
        return [(a.name, _output_count(a, node)) for a in op_def.output_arg]

    def add(self, node: Any, depth: int) -> None:
        function = self.called(node)
        if function is None:
            self.nodes.append(node)
        else:
            self.expand(node, function, depth)

    def expand(self, call: Any, function: Any, depth: int) -> None:
        if depth > _DEPTH_LIMIT:
            raise ModelLoadError(f"function {function.signature.name!r} nests calls deeper than {_DEPTH_LIMIT}; "
                                 "recserve does not inline recursive functions")
        prefix = f"{call.name}/"
        data_inputs = [ref for ref in call.input if not ref.startswith("^")]
        args = function.signature.input_arg
        if len(data_inputs) != len(args):
            raise ModelLoadError(f"call {call.name!r} passes {len(data_inputs)} inputs to {function.signature.name!r}, "
                                 f"which takes {len(args)}")
        flat: dict[str, str] = {}
        for arg, ref in zip(args, data_inputs):
            node = _identity(prefix + arg.name, ref, arg.type)
            flat[arg.name] = f"{node.name}:0"
            flat[f"^{arg.name}"] = f"^{node.name}"
            self.nodes.append(node)
        for body in function.node_def:
            index = 0
            for arg_name, count in self.output_args(body):
                for i in range(count):
                    flat[f"{body.name}:{arg_name}:{i}"] = f"{prefix}{body.name}:{index}"
                    index += 1
            flat[f"^{body.name}"] = f"^{prefix}{body.name}"
        for body in function.node_def:
            node = type(body)()
            node.CopyFrom(body)
            node.name = prefix + body.name
            try:
                node.input[:] = [flat[ref] for ref in body.input]
            except KeyError as exc:
                raise ModelLoadError(f"function {function.signature.name!r}: node {body.name!r} reads {exc.args[0]!r}, "
                                     "which the function does not define") from exc
            self.add(node, depth + 1)
        for k, arg in enumerate(function.signature.output_arg):
            self.redirect[f"{call.name}:{k}"] = flat[function.ret[arg.name]]
        # A control edge on the call becomes one on its body's outputs' producers: nothing
        # recserve serves waits on control edges (the cut prunes them), so it is dropped.
        self.redirect[f"^{call.name}"] = ""

    def resolve(self, ref: str) -> str:
        key = ref if ref.startswith("^") or ":" in ref else f"{ref}:0"
        seen = 0
        while key in self.redirect:
            key = self.redirect[key]
            seen += 1
            if seen > _DEPTH_LIMIT:
                raise ModelLoadError(f"tensor {ref!r} is returned by calls that return each other")
        return key


def inline_functions(graph_def: Any) -> tuple[Any, Callable[[str], str]]:
    """A copy of `graph_def` with every function call replaced by its body, and
    what a tensor name of the original graph (`call:k`) is in the copy."""
    inliner = _Inliner(graph_def.library)
    for node in graph_def.node:
        copy = type(node)()
        copy.CopyFrom(node)
        inliner.add(copy, 0)
    out = type(graph_def)()
    out.versions.CopyFrom(graph_def.versions)
    # Kept for the functional control flow left as nodes (If, While, ...: their branches and
    # bodies are library functions, converted by tf2onnx as they are).
    out.library.CopyFrom(graph_def.library)
    for node in inliner.nodes:
        inputs = [inliner.resolve(ref) for ref in node.input]
        node.input[:] = [ref for ref in inputs if ref]
        out.node.append(node)
    return out, inliner.resolve


def _identity(name: str, ref: str, dtype: int) -> Any:
    from tensorflow.core.framework import node_def_pb2

    node = node_def_pb2.NodeDef(name=name, op="Identity", input=[ref])
    node.attr["T"].type = dtype
    return node
