"""Requests `recserve perf` sends: Zipf ids in the user's range, shapes from the served
signature, requests read from warmup files and resized to a batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recserve.errors import RecserveError
from recserve.perf.served_signature import TensorSpec
from recserve.perf.traffic import ZipfKeys, read_requests, resize_batch, synthesize_requests
from recserve.warmup.warmup_file import write_warmup_file
from recserve.wire.codec import encode_request


def test_zipf_keys_stay_in_range_and_favour_low_keys() -> None:
    keys = ZipfKeys(1000, 1100, 1.2).sample_keys(50_000, np.random.default_rng(0))
    assert keys.dtype == np.int64 and keys.min() >= 1000 and keys.max() < 1100
    counts = np.bincount(keys - 1000, minlength=100)
    assert counts[0] > counts[1] > counts[10] > counts[99]
    # Zipf(1.2): rank 1 is 2**1.2 times as frequent as rank 2
    assert 2.0 < counts[0] / counts[1] < 2.6


def test_synthesized_requests_follow_the_signature() -> None:
    signature = {
        "user_id": TensorSpec(np.dtype(np.int64), (None,)),
        "clicked": TensorSpec(np.dtype(np.int64), (None, None)),
        "price": TensorSpec(np.dtype(np.float32), (None, 1)),
        "city": TensorSpec(np.dtype(object), (None,)),
        "slot": TensorSpec(np.dtype(np.int32), (None,)),
    }
    requests = synthesize_requests(signature, 8, 3, ZipfKeys(5, 50, 1.1), seed=1)
    assert len(requests) == 3
    first = requests[0]
    assert first["user_id"].shape == (8,) and first["clicked"].shape == (8, 4)
    assert first["price"].shape == (8, 1) and first["price"].dtype == np.float32 and not first["price"].any()
    assert first["city"].shape == (8,) and isinstance(first["city"][0], bytes)
    assert first["slot"].dtype == np.int32
    ids = np.concatenate([r["user_id"] for r in requests] + [r["clicked"].ravel() for r in requests])
    assert ids.min() >= 5 and ids.max() < 50
    assert not all(np.array_equal(requests[0]["user_id"], r["user_id"]) for r in requests[1:])


def test_requests_from_a_warmup_file_and_resized(tmp_path: Path) -> None:
    a = {"user_id": np.array([1, 2, 3], dtype=np.int64), "price": np.ones((3, 1), np.float32)}
    b = {"user_id": np.array([7], dtype=np.int64), "price": np.zeros((1, 1), np.float32)}
    path = tmp_path / "warm.bin"
    write_warmup_file(path, [encode_request(a), encode_request(b)])
    read = read_requests(str(path))
    assert [r["user_id"].tolist() for r in read] == [[1, 2, 3], [7]]
    resized = resize_batch(read, 5)
    assert resized[0]["user_id"].tolist() == [1, 2, 3, 1, 2] and resized[0]["price"].shape == (5, 1)
    assert resized[1]["user_id"].tolist() == [7] * 5
    assert resize_batch(read, 2)[0]["user_id"].tolist() == [1, 2]


def test_a_file_that_is_not_requests_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "junk.bin"
    path.write_bytes(b"\xff\xff\xff\xff not a request")
    with pytest.raises(RecserveError, match="request 0 is not a PredictRequest"):
        read_requests(str(path))
