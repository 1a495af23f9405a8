"""How one binding's string ids become table keys: XXH64, TensorFlow's hash buckets, or a
vocabulary's index (see the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

__all__ = ["StringKeys"]


@dataclass(frozen=True)
class StringKeys:
    """`buckets` > 0: StringToHashBucketFast; `vocabulary`: the string's index in it plus
    `vocabulary_start`; a string not in it gets `oov_start + Fingerprint64 % oov_buckets`
    when `oov_buckets` > 0, else `default_id` (-1: padding); else XXH64. '' is padding (-1)
    unless `empty_is_padding` is False (then hashed or looked up like any string; `buckets`
    or `vocabulary` only). Immutable."""

    buckets: int = 0
    vocabulary: Sequence[str | None] = ()  # None: an id no string has
    vocabulary_start: int = 0
    default_id: int = -1
    oov_buckets: int = 0
    oov_start: int = 0
    empty_is_padding: bool = True
    _index: dict[bytes, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self._index.update((word.encode("utf-8"), self.vocabulary_start + i) for i, word in enumerate(self.vocabulary)
                           if word is not None)
        if self.vocabulary and self.empty_is_padding:
            self._index.setdefault(b"", -1)  # '' is padding unless the vocabulary lists it

    @property
    def python_only(self) -> bool:
        """Keys computed here in Python (the native request route hashes XXH64 only)."""
        return bool(self.buckets or self.vocabulary or not self.empty_is_padding)

    def _empty_key(self) -> int:
        from recserve.embedding._purekeys import fingerprint64

        return fingerprint64(b"") % self.buckets

    def keys(self, values: np.ndarray) -> np.ndarray:
        """int64 keys of an array of strings (str or bytes), same shape."""
        from recserve.embedding import string_keys

        if not self.vocabulary:
            keys = string_keys(values.ravel(), self.buckets)
            if not self.empty_is_padding:
                keys[keys == -1] = self._empty_key()  # only '' is -1: hashes are >= 0
            return keys.reshape(values.shape)
        flat = [v.encode("utf-8") if isinstance(v, str) else bytes(v) for v in values.ravel().tolist()]
        return self._vocabulary_keys(flat).reshape(values.shape)

    def _vocabulary_keys(self, words: list[bytes]) -> np.ndarray:
        index = self._index
        if not self.oov_buckets:
            default = self.default_id
            return np.array([index.get(b, default) for b in words], dtype=np.int64)
        from recserve.embedding._purekeys import fingerprint64

        missing = -2  # no word's id: vocabulary ids are >= 0 and padding is -1
        out = np.array([index.get(b, missing) for b in words], dtype=np.int64)
        for i in np.flatnonzero(out == missing).tolist():
            out[i] = self.oov_start + fingerprint64(words[i]) % self.oov_buckets  # '' too, when not padding
        return out

    def keys_at(self, data: bytes, spans: np.ndarray) -> None:
        """The request parser's (start, length) pairs -> keys, in place (string_keys_at)."""
        from recserve.embedding import string_keys_at

        n = len(spans) // 2
        if not self.vocabulary:
            string_keys_at(data, spans, self.buckets)
            if not self.empty_is_padding:
                head = spans[:n]
                head[head == -1] = self._empty_key()
            return
        pairs = spans.tolist()
        spans[:n] = self._vocabulary_keys([data[s:s + k] for s, k in zip(pairs[0::2], pairs[1::2])])
