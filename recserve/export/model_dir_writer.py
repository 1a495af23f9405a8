"""Writing a savedmodel dir: `model.onnx` plus its spec (DESIGN §4)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx

from recserve.errors import ModelLoadError
from recserve.export.staging import staged_dir
from recserve.model_spec import ModelSpec, parse_model_spec
from recserve.model_store.model_dir import METADATA_KEY, MODEL_FILE, SPEC_FILE

__all__ = ["write_model_dir"]

# protobuf cannot serialize a message of 2 GiB or more; larger graphs keep external data.
_MAX_INLINE_BYTES = (2 << 30) - (64 << 20)
EXTERNAL_DATA_FILE = "model.onnx.data"


def write_model_dir(
    out_dir: str | os.PathLike[str],
    model: onnx.ModelProto | bytes | str | os.PathLike[str],
    spec: ModelSpec,
    *,
    spec_in_metadata: bool = False,
) -> Path:
    """Write `out_dir/model.onnx` and the spec — as `model.json`, or with
    `spec_in_metadata` inside the ONNX metadata_props under "recserve".

    The spec must parse back as model.json does and fit the graph: every binding's
    `graph_input` is a graph input, every signature name a graph input/output or a
    binding's input (else ModelLoadError). `out_dir` must not exist yet (StorageError).
    A `{"rows": file}` default is written as that .npy file from its DefaultSpec's matrix."""
    proto = _load(model)
    _check_spec(proto, spec)
    if spec_in_metadata:
        kept = [p for p in proto.metadata_props if p.key != METADATA_KEY]
        del proto.metadata_props[:]
        proto.metadata_props.extend(kept)
        proto.metadata_props.add(key=METADATA_KEY, value=spec.dumps())
    target = Path(out_dir)
    with staged_dir(target) as stage:
        if proto.ByteSize() > _MAX_INLINE_BYTES:
            onnx.save_model(proto, stage / MODEL_FILE, save_as_external_data=True,
                            all_tensors_to_one_file=True, location=EXTERNAL_DATA_FILE)
        else:
            onnx.save_model(proto, stage / MODEL_FILE)
        if not spec_in_metadata:
            (stage / SPEC_FILE).write_text(spec.dumps() + "\n", encoding="utf-8")
        for b in spec.embeddings:
            if b.default.kind == "rows":
                (stage / b.default.rows_file).parent.mkdir(parents=True, exist_ok=True)
                np.save(stage / b.default.rows_file, b.default.matrix, allow_pickle=False)
    return target


def _load(model: onnx.ModelProto | bytes | str | os.PathLike[str]) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)  # metadata is edited below; leave the caller's model alone
        return copy
    try:
        if isinstance(model, bytes):
            return onnx.load_model_from_string(model)
        return onnx.load(os.fspath(model))
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise ModelLoadError(f"model is not a readable ONNX model ({exc})") from exc


def _check_spec(model: onnx.ModelProto, spec: ModelSpec) -> None:
    parse_model_spec(spec.dumps(), source="spec")  # what a server reads back must parse
    for b in spec.embeddings:
        matrix = b.default.matrix
        if b.default.kind == "rows" and not (isinstance(matrix, np.ndarray) and matrix.dtype == np.float32
                                             and matrix.ndim == 2 and len(matrix) >= 1 and matrix.shape[1] == b.dim):
            raise ModelLoadError(f"binding of {b.input!r}: its {{\"rows\": {b.default.rows_file!r}}} default needs its "
                                 f"matrix (DefaultSpec.matrix), a float32 array of shape [k >= 1, {b.dim}]")
    initializers = {t.name for t in model.graph.initializer}
    graph_inputs = [i.name for i in model.graph.input if i.name not in initializers]
    graph_outputs = [o.name for o in model.graph.output]
    for b in spec.embeddings:
        if b.graph_input not in graph_inputs:
            raise ModelLoadError(
                f"binding of {b.input!r} feeds graph_input {b.graph_input!r}, which is not a "
                f"graph input; graph inputs are {graph_inputs}"
            )
    fed = {b.graph_input for b in spec.embeddings}
    request_inputs = [n for n in graph_inputs if n not in fed] + [b.input for b in spec.embeddings]
    for sig_name, sig in (spec.signatures or {}).items():
        for alias, name in sig.inputs.items():
            if name not in request_inputs:
                raise ModelLoadError(
                    f"signature {sig_name!r} input {alias!r} -> {name!r} names no request input; "
                    f"request inputs are {request_inputs}"
                )
        for alias, name in sig.outputs.items():
            if name not in graph_outputs:
                raise ModelLoadError(
                    f"signature {sig_name!r} output {alias!r} -> {name!r} names no graph output; "
                    f"graph outputs are {graph_outputs}"
                )
