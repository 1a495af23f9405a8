"""The trainer side of the model on disk (DESIGN §4): savedmodel dirs, checkpoint versions
and deltas, written atomically; the stable string key hash; the demo model."""

from recserve.export.checkpoint_writer import PADDING_KEY, write_checkpoint, write_delta
from recserve.export.model_dir_writer import write_model_dir
from recserve.export.stream_writer import RowUpdateWriter
from recserve.export.string_key import string_key, string_keys
from recserve.model_store.checkpoint import TableData

__all__ = [
    "PADDING_KEY",
    "RowUpdateWriter",
    "TableData",
    "string_key",
    "string_keys",
    "write_checkpoint",
    "write_delta",
    "write_model_dir",
]
