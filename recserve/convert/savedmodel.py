"""A TensorFlow SavedModel -> a recserve model dir (DESIGN §4c). Needs TensorFlow and tf2onnx
(the `recserve[tensorflow]` extra); runs in a process of its own (`python -m recserve.convert`),
never in a serving process.

The output is an ordinary model dir: `model.onnx` (the dense rest), `model.json` (one
binding per lookup, the table named after its variable; the signature), `variables/`
(the SavedModel's own bundle: the values served when there is no checkpoint_dir), and
`defaults/<table>.npy` for each Embedding Variable whose missing ids get a non-zero row
(ev_defaults.py).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recserve.convert.dense_export import dense_graph, lookup_input, output_name, to_onnx
from recserve.convert.ev_defaults import ev_defaults
from recserve.convert.function_inline import inline_functions
from recserve.convert.restore_keys import object_graph_keys, restore_keys
from recserve.convert.savedmodel_graph import Lookup, ServingGraph, find_lookups, node_name
from recserve.errors import ModelLoadError
from recserve.model_spec import DefaultSpec, EmbeddingBinding, ModelSpec, SignatureSpec

__all__ = ["SAVED_MODEL_FILE", "SERVE_TAG", "Conversion", "convert_savedmodel", "read_signature"]

SAVED_MODEL_FILE = "saved_model.pb"
VARIABLES = "variables/variables"
SERVE_TAG = "serve"
DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class Conversion:
    spec: ModelSpec
    lookups: tuple[Lookup, ...]
    signature: str
    warnings: tuple[str, ...] = ()


def read_signature(savedmodel_dir: str, signature_name: str | None) -> tuple[Any, str, Any]:
    """(the `serve` MetaGraphDef, the signature's name, its SignatureDef)."""
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel()
    path = os.path.join(savedmodel_dir, SAVED_MODEL_FILE)
    try:
        with open(path, "rb") as f:
            saved.ParseFromString(f.read())
    except Exception as exc:  # OSError, DecodeError
        raise ModelLoadError(f"{path}: not a readable SavedModel ({exc})") from exc
    metas = [m for m in saved.meta_graphs if SERVE_TAG in m.meta_info_def.tags]
    if not metas:
        tags = [list(m.meta_info_def.tags) for m in saved.meta_graphs]
        raise ModelLoadError(f"{path} has no MetaGraphDef tagged {SERVE_TAG!r}; its tag sets are {tags}")
    meta = metas[0]
    names = sorted(meta.signature_def)
    name = signature_name or (DEFAULT_SIGNATURE if DEFAULT_SIGNATURE in names or len(names) != 1 else names[0])
    if name not in meta.signature_def:
        raise ModelLoadError(f"signature_name {name!r} is not in {path}; it has {names}")
    return meta, name, meta.signature_def[name]


def _assets(savedmodel_dir: str, meta: Any) -> dict[str, str]:
    """The SavedModel's asset files: by the tensor naming them and by file name -> path."""
    folder = os.path.join(savedmodel_dir, "assets")
    out = {}
    for asset in meta.asset_file_def:
        out[asset.tensor_info.name] = out[asset.filename] = os.path.join(folder, asset.filename)
    if os.path.isdir(folder):
        for name in os.listdir(folder):
            out.setdefault(name, os.path.join(folder, name))
    return out


def _flat_graph(meta: Any, outputs: dict[str, str], variables: str) -> tuple[Any, dict[str, str], dict[str, str]]:
    """The serving graph without function calls (a TF2 SavedModel's are inlined), the
    signature's outputs in it, and the bundle key of each variable saved under another name
    (`variables`: the bundle's prefix)."""
    if not meta.graph_def.library.function:
        return meta.graph_def, outputs, {}
    flat, resolve = inline_functions(meta.graph_def)
    keys = restore_keys(flat) | object_graph_keys(meta, variables)
    return flat, {key: resolve(t) for key, t in outputs.items()}, keys


def convert_savedmodel(savedmodel_dir: str, out_dir: str, signature_name: str | None = None) -> Conversion:
    """Write the recserve model dir `out_dir` (must not exist) for `savedmodel_dir`."""
    from recserve.export import write_model_dir

    meta, name, sig = read_signature(savedmodel_dir, signature_name)
    inputs = {key: info.name for key, info in sig.inputs.items()}
    outputs = {key: info.name for key, info in sig.outputs.items()}
    variables = os.path.join(savedmodel_dir, VARIABLES)
    graph_def, graph_outputs, keys = _flat_graph(meta, outputs, variables)
    graph = ServingGraph(graph_def, inputs.values(), graph_outputs.values())
    placeholders = {node_name(info.name): info for info in sig.inputs.values()}
    warnings: list[str] = []
    lookups = find_lookups(graph, placeholders, warnings, _assets(savedmodel_dir, meta))
    dense, holds = dense_graph(graph_def, lookups, list(graph_outputs.values()), variables, keys)
    kept = {n.name for n in dense.node}
    bound = {lk.input for lk in lookups}
    dense_inputs = [t for t in inputs.values() if node_name(t) not in bound and node_name(t) in kept]
    both = sorted(node_name(t) for t in inputs.values() if node_name(t) in bound and node_name(t) in kept)
    if both:
        raise ModelLoadError(f"input(s) {both} feed a lookup and the dense graph too (Keras: an Embedding with "
                             "mask_zero=True before a layer that uses the mask); recserve binds an ids input to its "
                             "lookup only")
    model = to_onnx(dense, lookups, dense_inputs,
                    {graph_outputs[key]: output_name(t) for key, t in outputs.items()}, holds)
    defaults, default_warnings = ev_defaults(graph, graph_def, lookups)
    spec = ModelSpec(
        embeddings=tuple(EmbeddingBinding(
            input=lk.input, table=lk.table, dim=lk.dim, graph_input=lookup_input(lk), combiner=lk.engine_combiner,
            key_dtype=lk.key_dtype, default=defaults.get(lk.table, DefaultSpec()), mod_partitions=lk.mod_partitions,
            **lk.ids_options)  # type: ignore[arg-type]
            for lk in lookups),
        signatures={name: SignatureSpec(
            inputs={key: node_name(t) for key, t in inputs.items() if node_name(t) in bound or t in dense_inputs},
            outputs={key: output_name(t) for key, t in outputs.items()})},
        checkpoint_names={name: key for name, key in keys.items()
                          if name != key and (name in {lk.table for lk in lookups} or name in holds.values())},
    )
    write_model_dir(out_dir, model, spec)
    source = Path(savedmodel_dir, "variables")
    if source.is_dir():
        shutil.copytree(source, Path(out_dir, "variables"))
    return Conversion(spec, tuple(lookups), name, tuple(warnings + default_warnings))
