"""The requests a run sends, as input arrays: read from a file, or synthesized from the
served signature by the warmup synthesizer with ids from a Zipf distribution.

Synthesized ids: every integer input is taken for ids (a served signature does not say
which inputs feed embeddings), drawn from [LOW, HIGH) with rank r (Zipf, exponent s) as
key LOW + r - 1, so the lowest keys are the hottest, as in real traffic where a few items
and users take most lookups; caches and tiers then see a realistic hit rate. Float inputs
are zeros and string inputs fixed strings, as the warmup synthesizer makes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from recserve.errors import RecserveError
from recserve.perf.served_signature import TensorSpec
from recserve.warmup.synthesize import synthesize_inputs
from recserve.warmup.warmup_file import read_warmup_file
from recserve.wire.codec import decode_request

__all__ = ["ZipfKeys", "read_requests", "resize_batch", "synthesize_requests"]

Inputs = dict[str, np.ndarray]


@dataclass(frozen=True)
class ZipfKeys:
    """Keys in [low, high), Zipf-distributed by rank (the table the synthesizer draws from)."""

    low: int
    high: int
    exponent: float

    def sample_keys(self, n: int, rng: np.random.Generator) -> np.ndarray:
        span = self.high - self.low
        ranks = rng.zipf(self.exponent, n)
        while (over := ranks > span).any():  # bounded Zipf: redraw the ranks past the range
            ranks[over] = rng.zipf(self.exponent, int(over.sum()))
        return (self.low + ranks - 1).astype(np.int64)


@dataclass(frozen=True)
class _Binding:
    table: str
    key_dtype: str


@dataclass(frozen=True)
class _Input:
    dtype: np.dtype[Any]
    shape: tuple[int | None, ...]
    binding: _Binding | None


@dataclass(frozen=True)
class _Signature:
    inputs: Mapping[str, _Input]


def synthesize_requests(signature: Mapping[str, TensorSpec], batch: int, count: int, keys: ZipfKeys,
                        seed: int = 0) -> list[Inputs]:
    """`count` requests of `batch` rows for the served `signature`."""
    inputs = {}
    for alias, spec in signature.items():
        binding = (_Binding(alias, "int64") if spec.dtype.kind in "iu"
                   else _Binding(alias, "string") if spec.dtype == object else None)
        inputs[alias] = _Input(spec.dtype, spec.shape, binding)
    rng = np.random.default_rng(seed)
    tables = {alias: keys for alias, spec in inputs.items() if spec.binding is not None}
    out = []
    for _ in range(count):
        request = synthesize_inputs(_Signature(inputs), tables, batch=batch, rng=rng)
        out.append({a: v.astype(signature[a].dtype, copy=False) for a, v in request.items()})
    return out


def read_requests(path: str) -> list[Inputs]:
    """The requests of a warmup file (recserve's records, or one DeepRec PredictRequest)."""
    requests = []
    for i, data in enumerate(read_warmup_file(path)):
        try:
            requests.append(decode_request(data).inputs)
        except RecserveError as exc:
            raise RecserveError(f"--requests {path}: request {i} is not a PredictRequest: {exc.message}") from None
    if not requests:
        raise RecserveError(f"--requests {path} holds no requests")
    return requests


def resize_batch(requests: Sequence[Inputs], batch: int) -> list[Inputs]:
    """Each request with `batch` rows: its own rows repeated, or the first `batch` of them."""
    out = []
    for request in requests:
        rows = int(next(iter(request.values())).shape[0]) if request else 0
        if rows == 0:
            raise RecserveError("a request from --requests has no rows to repeat; give requests of batch >= 1")
        take = np.arange(batch) % rows
        out.append({name: np.take(value, take, axis=0) for name, value in request.items()})
    return out
