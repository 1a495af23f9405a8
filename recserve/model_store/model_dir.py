"""Reading a savedmodel dir: the graph `model.onnx` and its `model.json` (DESIGN §4), or a
TensorFlow SavedModel (`saved_model.pb`, DESIGN §4c), converted once into the former.

The spec comes from `model.json` when present, else from the ONNX `metadata_props` entry
"recserve", else it is empty: a plain ONNX model whose inputs and outputs serve as they are.
A dir holding both `saved_model.pb` and `model.onnx` is refused: which one to serve would
be a guess. A model dir with a TF bundle `variables/variables` (a SavedModel, or what
`recserve convert` wrote) serves that bundle's values when there is no checkpoint_dir.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx

from recserve.errors import ModelLoadError
from recserve.model_spec import ModelSpec, parse_model_spec
from recserve.model_store.checkpoint import Checkpoint
from recserve.model_store.default_rows import load_default_rows
from recserve.model_store.manifest import TF_BUNDLE_FORMAT, Manifest
from recserve.model_store.savedmodel_conversion import converted_model_dir
from recserve.model_store.storage import LocalStorage, Storage, join
from recserve.model_store.versions import VersionRef

__all__ = ["METADATA_KEY", "MODEL_FILE", "SAVED_MODEL_FILE", "SPEC_FILE", "ModelDir", "graph_checkpoint",
           "load_model_dir"]

MODEL_FILE = "model.onnx"
SPEC_FILE = "model.json"
METADATA_KEY = "recserve"
SAVED_MODEL_FILE = "saved_model.pb"
VARIABLES_PREFIX = "variables/variables"


@dataclass
class ModelDir:
    """A graph and its spec. `onnx_path` is a local path when the storage has one,
    else the storage path (a remote backend downloads it first). Immutable by convention."""

    onnx_path: str
    spec: ModelSpec
    # The directory holding model.onnx (a SavedModel's conversion, or savedmodel_dir itself).
    root: str = ""
    # Prefix of a TF bundle whose values serve without checkpoint_dir (a SavedModel's own).
    graph_bundle: str | None = None


def load_model_dir(storage: Storage, savedmodel_dir: str, signature_name: str | None = None) -> ModelDir:
    """The model in `savedmodel_dir`; a SavedModel is converted (cached) for `signature_name`."""
    onnx_path = join(savedmodel_dir, MODEL_FILE)
    has_onnx = storage.size(onnx_path) is not None
    if storage.size(join(savedmodel_dir, SAVED_MODEL_FILE)) is not None:
        if has_onnx:
            raise ModelLoadError(f"savedmodel_dir {savedmodel_dir} holds both a TensorFlow SavedModel "
                                 f"({SAVED_MODEL_FILE}) and a recserve model ({MODEL_FILE}); keep one of them")
        local = storage.local_path(savedmodel_dir)
        if local is None:
            raise ModelLoadError(f"savedmodel_dir {savedmodel_dir}: a SavedModel is converted from a local copy")
        converted = load_model_dir(storage, converted_model_dir(local, signature_name))
        return ModelDir(converted.onnx_path, converted.spec, converted.root,
                        join(local, VARIABLES_PREFIX) if storage.size(join(local, VARIABLES_PREFIX + ".index"))
                        is not None else None)
    if not has_onnx:
        children = storage.list(savedmodel_dir)
        if not storage.is_dir(savedmodel_dir):
            found = "it does not exist"
        elif children:
            found = f"it contains {children}"
        else:
            found = "it is empty"
        raise ModelLoadError(f"savedmodel_dir {savedmodel_dir} has no {MODEL_FILE} (recserve's format) or "
                             f"{SAVED_MODEL_FILE} (a TensorFlow SavedModel); {found}")
    spec_path = join(savedmodel_dir, SPEC_FILE)
    if storage.size(spec_path) is not None:
        spec = parse_model_spec(storage.read(spec_path), source=spec_path)
    else:
        spec = _spec_from_metadata(storage, onnx_path)
    spec = load_default_rows(spec, storage, savedmodel_dir)
    bundle = join(savedmodel_dir, VARIABLES_PREFIX)
    local_bundle = storage.local_path(bundle) if storage.size(bundle + ".index") is not None else None
    return ModelDir(onnx_path=storage.local_path(onnx_path) or onnx_path, spec=spec, root=savedmodel_dir,
                    graph_bundle=local_bundle)


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


def graph_checkpoint(model: ModelDir, savedmodel_dir: str) -> Checkpoint:
    """What serves without checkpoint_dir: the model's own `variables/` bundle (a SavedModel's
    values: tables by variable name, dense variables over the initializers), else nothing
    (the graph's initializers as they are)."""
    ref = VersionRef("graph", savedmodel_dir, 0)
    if model.graph_bundle is None:
        return Checkpoint(ref, Manifest("full", 0, {}), {}, {})
    from recserve.model_store.tf_checkpoint import tf_tables_and_dense

    tables, dense = tf_tables_and_dense(LocalStorage(), model.graph_bundle, delta=False)
    return Checkpoint(ref, Manifest("full", 0, {}, format=TF_BUNDLE_FORMAT), tables, dense)  # type: ignore[arg-type]
