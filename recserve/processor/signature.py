"""Serving signatures: which request inputs a model takes, which outputs it gives, and the
validation of a request against them (DESIGN §3).

A request names inputs by signature alias or by tensor name (`x` or `x:0`); each resolves
to an `InputSpec`, which is either a dense graph input or the ids of an embedding binding.
Immutable after construction; safe to share between threads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from recserve.errors import ModelLoadError, RequestError
from recserve.model_spec import EmbeddingBinding, ModelSpec

__all__ = ["GraphTensor", "InputSpec", "Signature", "build_signatures"]

DEFAULT_SIGNATURE = "serving_default"

# ONNX Runtime's type strings -> numpy dtypes for the graph's inputs and outputs.
_ORT_DTYPES = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(double)": np.dtype(np.float64),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(int64)": np.dtype(np.int64),
    "tensor(int32)": np.dtype(np.int32),
    "tensor(int16)": np.dtype(np.int16),
    "tensor(int8)": np.dtype(np.int8),
    "tensor(uint8)": np.dtype(np.uint8),
    "tensor(uint16)": np.dtype(np.uint16),
    "tensor(uint32)": np.dtype(np.uint32),
    "tensor(uint64)": np.dtype(np.uint64),
    "tensor(bool)": np.dtype(np.bool_),
    "tensor(string)": np.dtype(object),
}


@dataclass(frozen=True)
class GraphTensor:
    """A graph input or output as ONNX Runtime reports it; None in `shape` is a free dim."""

    name: str
    dtype: np.dtype[Any]
    shape: tuple[int | None, ...]

    @classmethod
    def from_ort(cls, arg: Any) -> GraphTensor:
        dtype = _ORT_DTYPES.get(arg.type)
        if dtype is None:
            raise ModelLoadError(f"graph tensor {arg.name!r} has type {arg.type}, which recserve cannot serve")
        shape = tuple(d if isinstance(d, int) and d >= 0 else None for d in (arg.shape or []))
        return cls(arg.name, dtype, shape)


def dtype_name(dtype: np.dtype[Any]) -> str:
    return "string" if dtype == np.dtype(object) else str(dtype)


def _shape_text(shape: Sequence[int | None]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@dataclass(frozen=True)
class InputSpec:
    """One request input: a dense graph input (binding is None) or an embedding binding's ids."""

    alias: str
    name: str  # the tensor name a request may use instead of the alias
    dtype: np.dtype[Any]  # int64 ids, object (strings) ids, or the graph input's dtype
    shape: tuple[int | None, ...]
    binding: EmbeddingBinding | None = None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": dtype_name(self.dtype), "shape": [-1 if d is None else d for d in self.shape]}

    @cached_property
    def _fixed_dims(self) -> tuple[tuple[int, int], ...]:
        return tuple((axis, size) for axis, size in enumerate(self.shape) if size is not None)

    @cached_property
    def _pools_single_ids(self) -> bool:
        return self.binding is not None and self.binding.combiner != "none"

    def check(self, value: Any) -> np.ndarray:
        """The request's array for this input, cast where safe; RequestError otherwise."""
        arr = value if type(value) is np.ndarray else np.asarray(value)
        if arr.dtype != self.dtype:
            arr = self._cast(arr)
        if arr.ndim == 1 and self._pools_single_ids:
            arr = arr.reshape(-1, 1)  # one id per sample pools to itself
        if arr.ndim != len(self.shape) or (
            self._fixed_dims and any(arr.shape[axis] != size for axis, size in self._fixed_dims)
        ):
            raise RequestError(
                f"input {self.alias!r}: shape {list(arr.shape)} does not match {_shape_text(self.shape)}"
                " (? is any size)"
            )
        return arr

    def _cast(self, arr: np.ndarray) -> np.ndarray:
        if self.dtype == np.dtype(object):
            if arr.dtype.kind not in "OSU":
                raise RequestError(f"input {self.alias!r}: expects strings, got {dtype_name(arr.dtype)}")
            return arr
        if arr.dtype.kind in "OSU" or not np.can_cast(arr.dtype, self.dtype, "safe"):
            raise RequestError(
                f"input {self.alias!r}: dtype {dtype_name(arr.dtype)} cannot be safely cast to "
                f"{dtype_name(self.dtype)}; send {dtype_name(self.dtype)}"
                + (" or a narrower integer type" if self.dtype.kind == "i" else "")
            )
        return arr.astype(self.dtype)


@dataclass(frozen=True)
class Signature:
    name: str
    inputs: Mapping[str, InputSpec]  # alias -> spec
    outputs: Mapping[str, GraphTensor]  # alias -> graph output

    @cached_property
    def description(self) -> Mapping[str, Any]:
        """`describe()` made once, shared: for request paths that read it on every request
        (TF Serving REST decodes by it); never to be modified."""
        return self.describe()

    def describe(self) -> dict[str, Any]:
        return {
            "signature_name": self.name,
            "inputs": {a: s.describe() for a, s in self.inputs.items()},
            "outputs": {
                a: {"name": t.name, "dtype": dtype_name(t.dtype), "shape": [-1 if d is None else d for d in t.shape]}
                for a, t in self.outputs.items()
            },
        }

    @cached_property
    def _names(self) -> dict[str, str]:
        """Every name a request may use for an input (alias, tensor name, `name:0`) -> alias."""
        names: dict[str, str] = {}
        for alias, spec in self.inputs.items():
            names[alias] = alias
            names.setdefault(spec.name, alias)
            names.setdefault(spec.name + ":0", alias)
        return names

    def alias(self, name: str) -> str | None:
        """The alias a request's input name (alias, tensor name or `name:0`) stands for."""
        return self._names.get(name)

    def resolve_inputs(self, request: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """Validated arrays keyed by alias; raises RequestError naming the problem."""
        names, specs = self._names, self.inputs
        resolved: dict[str, np.ndarray] = {}
        batch = -1
        consistent = True
        for key, value in request.items():
            alias = names.get(key)
            if alias is None:
                raise RequestError(
                    f"unknown input {key!r} for signature {self.name!r}; valid inputs are {sorted(specs)}"
                )
            if alias in resolved:
                raise RequestError(f"input {alias!r} is given twice (as an alias and as a tensor name)")
            arr = resolved[alias] = specs[alias].check(value)
            if arr.ndim:
                if batch < 0:
                    batch = arr.shape[0]
                elif arr.shape[0] != batch:
                    consistent = False
        if len(resolved) != len(specs):
            missing = sorted(a for a in specs if a not in resolved)
            raise RequestError(
                f"missing input(s) {missing} for signature {self.name!r}; it needs {sorted(specs)}"
            )
        if not consistent:
            detail = ", ".join(f"{a!r} has {arr.shape[0]}" for a, arr in sorted(resolved.items()) if arr.ndim)
            raise RequestError(f"inconsistent batch size across inputs: {detail}")
        return resolved

    def resolve_outputs(self, output_filter: Sequence[str] | None) -> list[tuple[str, str]]:
        """(key to answer under, output alias) pairs: an empty filter means every output under
        its alias; otherwise each output under the name the request used for it."""
        if not output_filter:
            return [(alias, alias) for alias in self.outputs]
        by_name: dict[str, str] = {}
        for alias, tensor in self.outputs.items():
            by_name[alias] = alias
            by_name.setdefault(tensor.name, alias)
            by_name.setdefault(tensor.name + ":0", alias)
        chosen: dict[str, str] = {}
        for key in output_filter:
            alias = by_name.get(key)
            if alias is None:
                raise RequestError(
                    f"unknown output {key!r} in output_filter for signature {self.name!r}; "
                    f"valid outputs are {sorted(self.outputs)}"
                )
            chosen.setdefault(key, alias)
        return list(chosen.items())


def _binding_input(binding: EmbeddingBinding, graph_input: GraphTensor) -> InputSpec:
    # The embedding graph input is [B, dim] (one id or pooled) or [B, L, dim] (unpooled list).
    rank = len(graph_input.shape)
    if graph_input.dtype != np.dtype(np.float32) or rank not in (2, 3):
        raise ModelLoadError(
            f"graph input {graph_input.name!r} (fed by binding {binding.input!r}) must be float32 "
            f"[batch, {binding.dim}] or [batch, length, {binding.dim}], the graph has "
            f"{dtype_name(graph_input.dtype)} {_shape_text(graph_input.shape)}"
        )
    if graph_input.shape[-1] not in (None, binding.dim):
        raise ModelLoadError(
            f"binding {binding.input!r} has dim {binding.dim} but graph input {graph_input.name!r} "
            f"has last dimension {graph_input.shape[-1]}"
        )
    if rank == 3 and binding.combiner != "none":
        raise ModelLoadError(
            f"binding {binding.input!r} pools with {binding.combiner!r} to [batch, dim], but graph input "
            f"{graph_input.name!r} is rank 3; use combiner 'none' for [batch, length, dim]"
        )
    if rank == 3:
        shape: tuple[int | None, ...] = (graph_input.shape[0], graph_input.shape[1])
    elif binding.combiner == "none":
        shape = (graph_input.shape[0],)
    else:
        shape = (graph_input.shape[0], None)
    dtype = np.dtype(object) if binding.key_dtype == "string" else np.dtype(np.int64)
    return InputSpec(binding.input, binding.input, dtype, shape, binding)


def build_signatures(
    spec: ModelSpec, graph_inputs: Sequence[GraphTensor], graph_outputs: Sequence[GraphTensor]
) -> dict[str, Signature]:
    """Signatures of a model; without `signatures` in model.json, `serving_default` maps every
    request input and every graph output to itself (DESIGN §4)."""
    by_graph_input = {t.name: t for t in graph_inputs}
    request_inputs: dict[str, InputSpec] = {}
    bound = set()
    for b in spec.embeddings:
        if b.graph_input not in by_graph_input:
            raise ModelLoadError(
                f"binding {b.input!r} feeds graph input {b.graph_input!r}, which the graph does not have; "
                f"graph inputs are {sorted(by_graph_input)}"
            )
        request_inputs[b.input] = _binding_input(b, by_graph_input[b.graph_input])
        bound.add(b.graph_input)
    for t in graph_inputs:
        if t.name not in bound:
            if t.name in request_inputs:
                raise ModelLoadError(f"request input {t.name!r} is both a binding input and a graph input")
            request_inputs[t.name] = InputSpec(t.name, t.name, t.dtype, t.shape)
    outputs = {t.name: t for t in graph_outputs}
    if spec.signatures is None:
        return {DEFAULT_SIGNATURE: Signature(DEFAULT_SIGNATURE, request_inputs, outputs)}
    signatures: dict[str, Signature] = {}
    for sig_name, sig in spec.signatures.items():
        inputs: dict[str, InputSpec] = {}
        for alias, name in sig.inputs.items():
            target = request_inputs.get(name.removesuffix(":0"))
            if target is None:
                raise ModelLoadError(
                    f"signature {sig_name!r} input {alias!r} names {name!r}, which is neither a binding "
                    f"input nor a graph input; valid names are {sorted(request_inputs)}"
                )
            inputs[alias] = InputSpec(alias, target.name, target.dtype, target.shape, target.binding)
        unmapped = set(request_inputs) - {s.name for s in inputs.values()}
        if unmapped:
            raise ModelLoadError(
                f"signature {sig_name!r} leaves graph/binding inputs {sorted(unmapped)} unfed; map each to an alias"
            )
        sig_outputs: dict[str, GraphTensor] = {}
        for alias, name in sig.outputs.items():
            target_out = outputs.get(name.removesuffix(":0"))
            if target_out is None:
                raise ModelLoadError(
                    f"signature {sig_name!r} output {alias!r} names {name!r}; graph outputs are {sorted(outputs)}"
                )
            sig_outputs[alias] = target_out
        signatures[sig_name] = Signature(sig_name, inputs, sig_outputs)
    return signatures
