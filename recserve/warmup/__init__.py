"""Warmup: requests a new model version answers before it serves (DESIGN §7).

Read and write warmup files (one DeepRec PredictRequest, or recserve's length-prefixed
records), record one from traffic, synthesize requests from a signature, run them.
"""

from recserve.warmup.recorder import WarmupRecorder
from recserve.warmup.runner import Warmup, WarmupResult
from recserve.warmup.synthesize import synthesize_inputs
from recserve.warmup.warmup_file import (
    MAGIC,
    decode_warmup,
    encode_warmup,
    read_warmup_file,
    write_warmup_file,
)

__all__ = [
    "MAGIC",
    "Warmup",
    "WarmupRecorder",
    "WarmupResult",
    "decode_warmup",
    "encode_warmup",
    "read_warmup_file",
    "synthesize_inputs",
    "write_warmup_file",
]
