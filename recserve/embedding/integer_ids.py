"""How one binding's integer ids become table keys through an integer vocabulary (a converted
SavedModel's integer vocabulary columns and Keras IntegerLookup layers): the id's index in the
list plus `vocabulary_start`, else `default_id`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["IntegerKeys"]


@dataclass(frozen=True)
class IntegerKeys:
    """An id in `vocabulary` gets `vocabulary_start` + its index (an id listed twice: its last
    index; None entries: keys no id has); any other id gets `default_id` (-1: padding). Id -1
    is padding (feature columns drop it before the lookup) unless `padding` is False (Keras
    IntegerLookup looks it up like any id). Immutable."""

    vocabulary: Sequence[int | None]
    vocabulary_start: int = 0
    default_id: int = -1
    padding: bool = True
    _sorted: list[np.ndarray] = field(default_factory=list, compare=False, repr=False)  # [ids, keys]

    def __post_init__(self) -> None:
        index = {word: self.vocabulary_start + i for i, word in enumerate(self.vocabulary) if word is not None}
        ids = np.array(sorted(index), dtype=np.int64)
        self._sorted.extend([ids, np.array([index[int(i)] for i in ids], dtype=np.int64)])

    def keys(self, values: np.ndarray) -> np.ndarray:
        """int64 keys of an array of integer ids, same shape."""
        ids, keys = self._sorted
        flat = np.asarray(values, dtype=np.int64).ravel()
        if not len(ids):
            out = np.full(flat.shape, self.default_id, dtype=np.int64)
        else:
            at = np.minimum(np.searchsorted(ids, flat), len(ids) - 1)
            out = np.where(ids[at] == flat, keys[at], self.default_id)
        if self.padding:
            out[flat == -1] = -1
        return out.reshape(np.shape(values))

    def keys_at(self, data: bytes, ids: np.ndarray) -> None:
        """A parsed request's int64 ids -> keys, in place (`data`: unused, as for strings' spans)."""
        ids[:] = self.keys(ids)
