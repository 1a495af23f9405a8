"""Reading a savedmodel dir: the graph `model.onnx` and its `model.json` (DESIGN §4).

The spec comes from `model.json` when present, else from the ONNX `metadata_props` entry
"recserve", else it is empty: a plain ONNX model whose inputs and outputs serve as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from recserve.errors import ModelLoadError
from recserve.model_spec import ModelSpec, parse_model_spec
from recserve.model_store.storage import Storage, join

__all__ = ["METADATA_KEY", "MODEL_FILE", "SPEC_FILE", "ModelDir", "load_model_dir"]

MODEL_FILE = "model.onnx"
SPEC_FILE = "model.json"
METADATA_KEY = "recserve"


@dataclass
class ModelDir:
    """A graph and its spec. `onnx_path` is a local path when the storage has one,
    else the storage path (a remote backend downloads it first). Immutable by convention."""

    onnx_path: str
    spec: ModelSpec


def load_model_dir(storage: Storage, savedmodel_dir: str) -> ModelDir:
    onnx_path = join(savedmodel_dir, MODEL_FILE)
    if storage.size(onnx_path) is None:
        children = storage.list(savedmodel_dir)
        if not storage.is_dir(savedmodel_dir):
            found = "it does not exist"
        elif children:
            found = f"it contains {children}"
        else:
            found = "it is empty"
        raise ModelLoadError(f"savedmodel_dir {savedmodel_dir} has no {MODEL_FILE}; {found}")
    spec_path = join(savedmodel_dir, SPEC_FILE)
    if storage.size(spec_path) is not None:
        spec = parse_model_spec(storage.read(spec_path), source=spec_path)
    else:
        spec = _spec_from_metadata(storage, onnx_path)
    return ModelDir(onnx_path=storage.local_path(onnx_path) or onnx_path, spec=spec)


def _spec_from_metadata(storage: Storage, onnx_path: str) -> ModelSpec:
    local = storage.local_path(onnx_path)
    try:
        if local is not None:
            model = onnx.load(local, load_external_data=False)
        else:
            model = onnx.load_model_from_string(storage.read(onnx_path))
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise ModelLoadError(f"{onnx_path}: not a readable ONNX model ({exc})") from exc
    for prop in model.metadata_props:
        if prop.key == METADATA_KEY:
            source = f"{onnx_path} metadata_props[{METADATA_KEY!r}]"
            return parse_model_spec(prop.value, source=source)
    return ModelSpec()
