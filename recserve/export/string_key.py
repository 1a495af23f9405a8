"""The stable string -> int64 key hash of `"key_dtype": "string"` features (DESIGN §4):
XXH64 with seed 0 of the UTF-8 bytes, read as a signed int64. The empty string is padding."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import xxhash

from recserve.export.checkpoint_writer import PADDING_KEY

__all__ = ["string_key", "string_keys"]


def string_key(value: str | bytes) -> int:
    """The table key of one string feature value; PADDING_KEY (-1) for the empty string."""
    data = value.encode("utf-8") if isinstance(value, str) else value
    if not data:
        return PADDING_KEY
    return int(np.uint64(xxhash.xxh64_intdigest(data, seed=0)).view(np.int64))


def string_keys(values: Iterable[str | bytes]) -> np.ndarray:
    """`string_key` of each value, as an int64 array (e.g. the `keys` of a string table)."""
    return np.fromiter((string_key(v) for v in values), dtype=np.int64)
