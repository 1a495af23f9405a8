"""The stable string -> int64 key hash of `"key_dtype": "string"` features (DESIGN §4):
XXH64 with seed 0 of the UTF-8 bytes, read as a signed int64. The empty string is padding.

Trainers get the very function serving uses: `recserve.embedding.string_keys`."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from recserve.embedding import string_keys as _engine_string_keys

__all__ = ["string_key", "string_keys"]


def string_keys(values: Iterable[str | bytes]) -> np.ndarray:
    """The table key of each value, as an int64 array (e.g. the `keys` of a string table);
    PADDING_KEY (-1) for the empty string."""
    return _engine_string_keys(list(values))


def string_key(value: str | bytes) -> int:
    """The table key of one string feature value; PADDING_KEY (-1) for the empty string."""
    return int(string_keys([value])[0])
