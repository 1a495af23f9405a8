"""How one binding's string ids become table keys: XXH64, TensorFlow's hash buckets, or a
vocabulary's index (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["StringKeys"]


_MISSING = -2  # "not in the vocabulary" while keys are computed: ids are >= 0 and padding is -1
# Up to this many strings a dict lookup by bytes is quicker than the native hash and search
# (numpy's fixed cost per call dominates a batch-1 request).
_FEW = 8


@dataclass(frozen=True)
class StringKeys:
    """`buckets` > 0: StringToHashBucketFast; `vocabulary`: the string's index in it plus
    `vocabulary_start` (None entries: ids no string has); a string not in it gets
    `oov_start + Fingerprint64 % oov_buckets` when `oov_buckets` > 0, else `default_id`
    (-1: padding); else XXH64. '' is padding (-1), even where the vocabulary lists it, unless
    `empty_is_padding` is False (then hashed or looked up like any string; `buckets` or
    `vocabulary` only). Immutable.

    A vocabulary is looked up natively: each string's XXH64 (the native batch hash) is
    searched among the words' sorted XXH64s, so a string is taken for a word when their
    64-bit hashes are equal (the words' own hashes are checked distinct here; a vocabulary
    whose words collide, and a call of at most _FEW strings, are looked up by bytes instead)."""

    buckets: int = 0
    vocabulary: Sequence[str | None] = ()
    vocabulary_start: int = 0
    default_id: int = -1
    oov_buckets: int = 0
    oov_start: int = 0
    empty_is_padding: bool = True
    _index: dict[bytes, int] = field(default_factory=dict, compare=False, repr=False)
    _sorted: list[np.ndarray] = field(default_factory=list, compare=False, repr=False)  # [hashes, ids] or []

    def __post_init__(self) -> None:
        from recserve.embedding import string_keys

        # '' is left out while it is padding: the empty string is padding even where the list
        # holds it (as TensorFlow's feature columns drop '' ids before the lookup).
        self._index.update((word.encode("utf-8"), self.vocabulary_start + i) for i, word in enumerate(self.vocabulary)
                           if word is not None and (word or not self.empty_is_padding))
        words = [w for w in self._index if w]
        if words:
            hashes = string_keys(np.array(words, dtype=object))
            order = np.argsort(hashes, kind="stable")
            hashes = hashes[order]
            if not (hashes[1:] == hashes[:-1]).any():
                ids = np.array([self._index[w] for w in words], dtype=np.int64)[order]
                self._sorted.extend([hashes, ids])

    @property
    def indices(self) -> dict[bytes, int]:
        """The vocabulary's UTF-8 words and their keys (a word listed twice: its last index);
        what the native route builds its lookup table from. Do not modify."""
        return self._index

    @property
    def native_keyed(self) -> bool:
        """Whether the native request route keys these strings as this does: XXH64, hash
        buckets, or a vocabulary's `indices` with '' and unknown words -1 (padding)."""
        return self.empty_is_padding and self.default_id == -1 and not self.oov_buckets

    @staticmethod
    def _empty_key(buckets: int) -> int:
        from recserve.embedding._purekeys import fingerprint64

        return fingerprint64(b"") % buckets

    def keys(self, values: np.ndarray) -> np.ndarray:
        """int64 keys of an array of strings (str or bytes), same shape."""
        from recserve.embedding import string_keys

        if not self.vocabulary:
            keys = string_keys(values.ravel(), self.buckets)
            if not self.empty_is_padding:
                keys[keys == -1] = self._empty_key(self.buckets)  # only '' is -1: hashes are >= 0
            return keys.reshape(values.shape)
        flat = values.ravel()
        if self._sorted and len(flat) > _FEW:
            ids = self._found(string_keys(flat))
            self._unknown(ids, lambda at, buckets: string_keys(flat[at], buckets))
            return ids.reshape(values.shape)
        words = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in flat.tolist()]
        return self._looked_up(words).reshape(values.shape)

    def _found(self, hashes: np.ndarray) -> np.ndarray:
        """Ids of the strings whose XXH64 is a word's; '' (hash -1) by the index; else _MISSING."""
        sorted_hashes, ids = self._sorted
        at = np.minimum(np.searchsorted(sorted_hashes, hashes), len(sorted_hashes) - 1)
        out = np.where(sorted_hashes[at] == hashes, ids[at], _MISSING)
        out[hashes == -1] = -1 if self.empty_is_padding else self._index.get(b"", _MISSING)
        return out

    def _unknown(self, ids: np.ndarray, bucket: Callable[[np.ndarray, int], np.ndarray]) -> None:
        """_MISSING ids -> their OOV bucket (`bucket(positions, k)`: Fingerprint64 mod k of
        those strings, '' as -1) or the default id, in place."""
        at = np.flatnonzero(ids == _MISSING)
        if not len(at):
            return
        if not self.oov_buckets:
            ids[at] = self.default_id
            return
        hashed = bucket(at, self.oov_buckets)
        hashed[hashed == -1] = self._empty_key(self.oov_buckets)  # '' reaches here only when it is not padding
        ids[at] = self.oov_start + hashed

    def _looked_up(self, words: list[bytes]) -> np.ndarray:
        """By bytes, in Python (a vocabulary whose words share an XXH64)."""
        from recserve.embedding import string_keys

        index, padding = self._index, self.empty_is_padding
        ids = np.array([index.get(b, _MISSING) if b or not padding else -1 for b in words], dtype=np.int64)
        self._unknown(ids, lambda at, buckets: string_keys(np.array([words[i] for i in at.tolist()], dtype=object),
                                                           buckets))
        return ids

    def keys_at(self, data: bytes, spans: np.ndarray) -> None:
        """The request parser's (start, length) pairs -> keys, in place (string_keys_at)."""
        from recserve.embedding import string_keys_at

        n = len(spans) // 2
        if not self.vocabulary:
            string_keys_at(data, spans, self.buckets)
            if not self.empty_is_padding:
                head = spans[:n]
                head[head == -1] = self._empty_key(self.buckets)
            return
        if not self._sorted or n <= _FEW:
            pairs = spans.tolist()
            spans[:n] = self._looked_up([data[s:s + k] for s, k in zip(pairs[0::2], pairs[1::2])])
            return
        pairs = spans.copy()

        def bucket(at: np.ndarray, buckets: int) -> np.ndarray:
            chosen = np.ascontiguousarray(pairs.reshape(-1, 2)[at]).reshape(-1)
            string_keys_at(data, chosen, buckets)
            return chosen[:len(at)]

        hashes = spans.copy()
        string_keys_at(data, hashes, 0)
        ids = self._found(hashes[:n])
        self._unknown(ids, bucket)
        spans[:n] = ids
