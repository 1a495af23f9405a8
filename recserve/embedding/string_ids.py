"""How one binding's string ids become table keys: XXH64, TensorFlow's hash buckets, or a
vocabulary's index (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["StringKeys"]


@dataclass(frozen=True)
class StringKeys:
    """`buckets` > 0: StringToHashBucketFast; `vocabulary`: the string's index in it, or -1
    (padding) when absent; else XXH64. '' is padding (-1) in every case. Immutable."""

    buckets: int = 0
    vocabulary: Sequence[str] = ()
    _index: dict[bytes, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        # '' is left out: the empty string is padding even where the list holds it (as
        # TensorFlow's feature columns drop '' ids before the lookup).
        self._index.update((word.encode("utf-8"), i) for i, word in enumerate(self.vocabulary) if word)

    @property
    def indices(self) -> dict[bytes, int]:
        """The vocabulary's UTF-8 words and their keys (a word listed twice: its last index);
        what the native route builds its lookup table from. Do not modify."""
        return self._index

    def keys(self, values: np.ndarray) -> np.ndarray:
        """int64 keys of an array of strings (str or bytes), same shape."""
        from recserve.embedding import string_keys

        if not self.vocabulary:
            return string_keys(values.ravel(), self.buckets).reshape(values.shape)
        index = self._index
        flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values.ravel().tolist()]
        return np.array([index.get(b, -1) for b in flat], dtype=np.int64).reshape(values.shape)

    def keys_at(self, data: bytes, spans: np.ndarray) -> None:
        """The request parser's (start, length) pairs -> keys, in place (string_keys_at)."""
        from recserve.embedding import string_keys_at

        if not self.vocabulary:
            string_keys_at(data, spans, self.buckets)
            return
        pairs = spans.tolist()
        index = self._index
        spans[:len(pairs) // 2] = [index.get(data[s:s + n], -1) for s, n in zip(pairs[0::2], pairs[1::2])]
