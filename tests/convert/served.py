"""Serving a converted SavedModel and comparing with TensorFlow's answers, for the SavedModel
tests: by EAS protobuf bytes and by predict, and the native route's counters."""

from __future__ import annotations

import numpy as np

from recserve import Processor
from recserve.wire.codec import decode_response, encode_request


def worst(processor: Processor, batches: list[dict[str, np.ndarray]], want: list[np.ndarray]) -> float:
    """Max |recserve - TensorFlow| over EAS protobuf requests (Processor.process) and predict."""
    largest = 0.0
    for batch, expected in zip(batches, want):
        status, body = processor.process(encode_request(batch))
        assert status == 200, body
        by_bytes = decode_response(body)["prob"]
        by_predict = processor.predict(batch)["prob"]
        assert by_bytes.shape == expected.shape
        largest = max(largest, float(np.abs(by_bytes - expected).max()), float(np.abs(by_predict - expected).max()))
    return largest


def layouts(batches: list[dict[str, np.ndarray]]) -> int:
    """How many request layouts (input names, dtypes, shapes) `batches` hold."""
    return len({tuple((k, v.dtype.str, v.shape) for k, v in b.items()) for b in batches})


def assert_served_natively(processor: Processor, batches: list[dict[str, np.ndarray]]) -> None:
    """After `worst` (each request asked twice: by bytes and by predict): every request but
    the first of each layout, each way, was answered by the native route -- hashed strings
    and vocabularies are keyed in C."""
    native = processor.model_info()["native_route"]
    assert native["served"] == 2 * (len(batches) - layouts(batches)), native
    assert native["fallbacks"]["route_miss"] == 2 * layouts(batches), native
