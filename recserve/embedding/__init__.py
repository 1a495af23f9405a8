"""The embedding engine: tables of int64 key -> float32 row, looked up natively.

    t = EmbeddingTable("user", 16, keys, values, default=DefaultSpec("normal", 0.01, 7))
    t.lookup(ids)                       # [B] -> [B, 16]; [B, L] -> [B, L, 16]; -1 = padding
    t.lookup(ids, "mean")               # [B, L] -> [B, 16], mean over non-padding ids
    plan = LookupPlan([(t, "none"), (items, "sum")])
    user_emb, item_emb = plan.run([user_ids, item_ids])   # one native call per request

Tables larger than RAM: ``EmbeddingTable(..., storage=TierSpec(...))`` keeps every row in
record files and the hottest in a DRAM tier of a fixed budget (``tiers.py``, docs/tiers.md).

The native engine (native/embedding.h: hash index + row storage, lock-free readers, one
writer) is used unless ``RECSERVE_PURE_PYTHON=1`` is set when this package is imported; then
the pure-Python twin (``_pure.py``), which defines the same API and computes the same bits,
serves instead. Request-data errors (ids of the wrong dtype or shape) raise
``recserve.errors.RequestError``; errors in what the caller set up (table contents, combiner
names, ``out`` buffers) raise ``ValueError``.

Lookup semantics. Padding ids (-1) give zero rows and are skipped by pooling. An unknown key
(neither padding nor in the table) gets the table's default and counts toward mean/sqrtn
like a known key. Pooling adds rows in float32 in id order starting from +0.0; ``mean``
then divides by float32(count) and ``sqrtn`` by sqrt(float32(count)), count = non-padding
ids; a sample without ids pools to zeros. [B] ids with a pooling combiner act like [B, 1].

String keys (``key_dtype: "string"``). A string's key is XXH64 with seed 0 of its UTF-8
bytes, read as a two's-complement int64; the empty string is padding (-1). Trainers get the
same key with the ``xxhash`` package::

    key = xxhash.xxh64_intdigest(s.encode("utf-8"))
    key = key - 2**64 if key >= 2**63 else key

With ``buckets`` N > 0 (``string_keys(values, N)``, a binding's ``"key_hash":
"farmhash64_mod"``) the key is TensorFlow's ``StringToHashBucketFast``: Fingerprint64
(farmhash's farmhashna::Hash64, unsigned) of the bytes modulo N — what ``tf.strings.
to_hash_bucket_fast`` returns, bit for bit; '' is still padding. ``StringKeys`` picks the
function of a binding, vocabulary lookups included (a string's index in the list plus
``vocabulary_start``; when absent, ``oov_start`` + Fingerprint64 mod ``oov_buckets`` if
those are set, else ``default_id``, -1 — padding — by default, as TensorFlow's feature
columns drop out-of-vocabulary ids), and with ``empty_is_padding=False`` '' hashed or looked
up like any string (Keras's Hashing and StringLookup layers).

Default rows, ``DefaultSpec("normal", stddev, seed)``. The row of unknown key k (all
arithmetic on unsigned 64-bit integers, modulo 2**64; seed taken modulo 2**64; k as its
two's-complement bits)::

    splitmix64(x) = z ^ (z >> 31) where x' = x + 0x9E3779B97F4A7C15,
                    y = (x' ^ (x' >> 30)) * 0xBF58476D1CE4E5B9,
                    z = (y ^ (y >> 27)) * 0x94D049BB133111EB
    stream = splitmix64(splitmix64(seed) ^ k)
    for j = 0, 2, 4, ... < dim:                       # Box-Muller in IEEE double
        a = splitmix64(stream + j); b = splitmix64(stream + j + 1)
        u1 = ((a >> 11) + 1) * 2**-53                 # (0, 1]
        u2 = (b >> 11) * 2**-53                       # [0, 1)
        r = sqrt(-2 * log(u1)); theta = 6.283185307179586 * u2
        row[j] = float32(stddev * (r * cos(theta)))
        row[j + 1] = float32(stddev * (r * sin(theta)))   # if j + 1 < dim

Both implementations call the C library's log/sin/cos, so rows are bit-identical between
them and across calls and replicas; a trainer on another libm may differ in the last bit
of a double, which practically never survives the rounding to float32.

Default rows, ``DefaultSpec("rows", rows_file=..., matrix=M)`` (M float32 [k, dim], read from
the model dir by recserve.model_store.default_rows): unknown key k gets ``M[k mod k']`` with
floor modulo, Python's ``%`` (key -5, k' = 4: row 3), DeepRec's Embedding Variable's default.
The native table copies M into memory it owns (the shared arena when reserved).
"""

from __future__ import annotations

import os

if os.environ.get("RECSERVE_PURE_PYTHON") == "1":
    from recserve.embedding._pure import (
        EmbeddingTable,
        LookupPlan,
        default_vectors,
        string_keys,
        string_keys_at,
    )

    IMPLEMENTATION = "python"
else:
    from recserve.embedding._native import (  # type: ignore[assignment]
        EmbeddingTable,
        LookupPlan,
        default_vectors,
        string_keys,
        string_keys_at,
    )

    IMPLEMENTATION = "native"

from recserve.embedding._inputs import DuplicateKeyError
from recserve.embedding.integer_ids import IntegerKeys
from recserve.embedding.string_ids import StringKeys
from recserve.embedding.tiers import TierSpec, tier_spec
from recserve.model_store.row_memory import empty_rows

__all__ = [
    "IMPLEMENTATION",
    "DuplicateKeyError",
    "EmbeddingTable",
    "IntegerKeys",
    "LookupPlan",
    "StringKeys",
    "TierSpec",
    "default_vectors",
    "empty_rows",
    "string_keys",
    "string_keys_at",
    "tier_spec",
]
