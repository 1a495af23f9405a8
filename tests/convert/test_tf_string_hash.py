"""String ids hashed exactly as TensorFlow's StringToHashBucketFast (Fingerprint64, farmhash,
modulo the buckets): recserve's native hash and its pure-Python twin against TensorFlow's own
`tf.strings.to_hash_bucket_fast` outputs."""

from __future__ import annotations

import numpy as np
from tf_helpers import run_tf

from recserve.embedding import _native, _pure

BUCKETS = [1, 7, 1000, 2**31 - 1, 2**62 + 12345]


def _strings() -> list[bytes]:
    rng = np.random.default_rng(5)
    words = [b"a", b"ab", b"abc", b"beijing", "北京".encode(), "zürich".encode(), "🙂".encode(), b"\x00", b"\xff\xfe"]
    words += [bytes(rng.integers(0, 256, n, dtype=np.uint8)) for n in range(1, 300)]   # every length 1..299
    words += [("x" * n).encode() for n in (15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 4096)]
    return words


def test_buckets_match_tensorflow(tmp_path):
    words = _strings()
    np.savez(tmp_path / "in.npz", strings=np.array(words, dtype=object), buckets=np.array(BUCKETS, dtype=np.uint64))
    run_tf("hash", str(tmp_path / "in.npz"), str(tmp_path / "out.npz"))
    values = np.array(words + [b""], dtype=object)
    with np.load(tmp_path / "out.npz") as tf_out:
        for buckets in BUCKETS:
            want = tf_out[str(buckets)].astype(np.int64)
            for impl in (_native, _pure):
                got = impl.string_keys(values, buckets)
                assert got[-1] == -1  # '' is padding, as TF's feature columns drop it before hashing
                mismatched = [(w[:12], int(g), int(t)) for w, g, t in zip(words, got, want) if g != t]
                assert not mismatched, (impl.__name__, buckets, mismatched[:5])


def test_buckets_at_request_spans_match_the_batch_call():
    words = _strings()
    data = b"".join(words)
    spans, at = [], 0
    for w in words:
        spans += [at, len(w)]
        at += len(w)
    for impl in (_native, _pure):
        packed = np.array(spans, dtype=np.int64)
        impl.string_keys_at(data, packed, 1000)
        assert packed[:len(words)].tolist() == _native.string_keys(np.array(words, dtype=object), 1000).tolist()
