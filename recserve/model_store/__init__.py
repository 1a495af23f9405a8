"""The model on disk (DESIGN §4): storage backends, version discovery and verification,
reading checkpoints and savedmodel dirs."""

from recserve.model_store.checkpoint import (
    Checkpoint,
    TableData,
    load_checkpoint,
    read_dense,
    read_table,
    table_file,
)
from recserve.model_store.manifest import FileEntry, Manifest, read_manifest, verify
from recserve.model_store.model_dir import ModelDir, load_model_dir
from recserve.model_store.storage import LocalStorage, Storage, join
from recserve.model_store.versions import (
    VersionRef,
    list_deltas,
    list_full_versions,
    newest_complete_version,
)

__all__ = [
    "Checkpoint",
    "FileEntry",
    "LocalStorage",
    "Manifest",
    "ModelDir",
    "Storage",
    "TableData",
    "VersionRef",
    "join",
    "list_deltas",
    "list_full_versions",
    "load_checkpoint",
    "load_model_dir",
    "newest_complete_version",
    "read_dense",
    "read_manifest",
    "read_table",
    "table_file",
    "verify",
]
