"""Warmup requests made up from a signature when there is no warmup file.

Ids are keys that exist in the tables (`EmbeddingTable.sample_keys`): random ids would
only exercise the default-row path, and out-of-range ids have crashed other servers'
Gathers. String-keyed inputs get strings that are not in the table (a hash cannot be
inverted), so they exercise hashing and the default rows. Dense inputs are zeros — a
value every numeric feature accepts, including ones the graph uses as indices.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np

__all__ = ["synthesize_inputs"]

PADDING = -1
# Length given to a free list dimension ([batch, ?] ids, or any free non-batch dense dim).
LIST_LENGTH = 4


class _Table(Protocol):
    def sample_keys(self, n: int, rng: np.random.Generator) -> np.ndarray: ...


def _shape(shape: tuple[int | None, ...], batch: int) -> tuple[int, ...]:
    return tuple((batch if i == 0 else LIST_LENGTH) if d is None else d for i, d in enumerate(shape))


def _ids(table: _Table, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    n = int(np.prod(shape))
    try:
        keys = table.sample_keys(n, rng)
    except ValueError:  # an empty table: nothing exists, so pad
        keys = np.full(n, PADDING, dtype=np.int64)
    return keys.reshape(shape)


def synthesize_inputs(
    signature: Any, tables: Mapping[str, _Table], *, batch: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One request's inputs (keyed by alias) for `signature` (a recserve Signature)."""
    inputs: dict[str, np.ndarray] = {}
    for alias, spec in signature.inputs.items():
        shape = _shape(spec.shape, batch)
        binding = spec.binding
        if binding is not None and binding.key_dtype == "string":
            words = [f"recserve-warmup-{i}".encode() for i in range(int(np.prod(shape)))]
            inputs[alias] = np.array(words, dtype=object).reshape(shape)
        elif binding is not None:
            inputs[alias] = _ids(tables[binding.table], shape, rng)
        elif spec.dtype == np.dtype(object):
            inputs[alias] = np.full(shape, b"", dtype=object)
        else:
            inputs[alias] = np.zeros(shape, dtype=spec.dtype)
    return inputs
