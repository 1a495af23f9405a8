"""Integer vocabularies on the native request route: a binding's int64 ids keyed by an
integer vocabulary (`"key_hash": "vocabulary"`, `"key_dtype": "int64"`: converted feature
columns' integer vocabulary lists and Keras IntegerLookup) are keyed in C
(native/route_int_vocabulary.c), not in Python. The spec is recserve.embedding.IntegerKeys
through the Python route (`Processor.process_python`): the native route's bytes must be its
bytes, and the embeddings must equal the independent reference (recserve.export.reference)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.models import BRANDS, SHOPS, IntVocabularyModel, build_int_vocabulary
from recserve import Processor
from recserve.embedding import IntegerKeys
from recserve.export.reference import Reference
from recserve.model_spec import EmbeddingBinding
from recserve.processor import servable as servable_module
from recserve.wire import codec
from recserve.wire.codec import decode_response, encode_request
from tests.processor.test_native_route import (
    _assert_native_equals_python,
    _python_route,
    _serve_while_versions_swap,
    _served,
)
from tests.processor.test_native_route_tfs import _native as _tfs_native
from tests.processor.test_native_route_tfs import _python_route as _tfs_python_route
from tests.processor.test_native_route_tfs import _request as _tfs_request
from tests.processor.test_native_route_tfs import _tensor

pytestmark = pytest.mark.skipif(codec._native is None, reason="routes need the native parser (RECSERVE_PURE_PYTHON=1)")

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
# Every awkward id: listed ones (42 twice, -5, past 2**32 and 2**62), -1, unlisted negative
# and large ones, int64's extremes, 2**32 (unlisted; its low 32 bits are 0, which is listed).
EDGE_IDS = [-1, 42, 7, -5, 1 << 33, 0, 9, 123_456_789, (1 << 62) + 3, -2, 1 << 32, INT64_MIN, INT64_MAX, 3, 1, 92,
            -1 - (1 << 32), 8]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> IntVocabularyModel:
    return build_int_vocabulary(tmp_path_factory.mktemp("int_vocabulary"))


@pytest.fixture(scope="module")
def processor(model: IntVocabularyModel) -> Iterator[Processor]:
    p = Processor(model.config())
    yield p
    p.close()


def _fallbacks(processor: Processor) -> dict[str, int]:
    return processor.model_info()["native_route"]["fallbacks"]


def _edge_request(model: IntVocabularyModel) -> dict[str, np.ndarray]:
    batch = len(EDGE_IDS)
    request = model.sample(batch, np.random.default_rng(31))
    ids = np.array(EDGE_IDS, dtype=np.int64)
    request["brand"] = ids
    request["item"] = np.concatenate([ids[:-4], np.array(model.items[1:5], dtype=np.int64)])
    request["shop"] = np.stack([np.roll(ids, k) for k in range(model.length)], axis=1)
    return request


def test_integer_vocabulary_requests_are_served_natively_byte_for_byte(
    processor: Processor, model: IntVocabularyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert processor.model_info()["native_route"]["enabled"]
    assert len(processor._manager.current.native._vocabularies) == 3   # one per binding, built with the version
    rng = np.random.default_rng(21)
    before = _fallbacks(processor)
    for batch in (1, 2, 3, 7, 64, 1, 64):   # repeats: the same layouts, new ids
        for _ in range(3):
            _assert_native_equals_python(processor, encode_request(model.sample(batch, rng)), monkeypatch)
    # Only each layout's first request (5 batch sizes) took Python; none is `not_native`.
    assert _fallbacks(processor) == {**before, "route_miss": before["route_miss"] + 5}


def test_edge_ids_are_keyed_as_integer_keys_keys_them(
    processor: Processor, model: IntVocabularyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Known ids, a duplicated one, -1 as padding (shop, brand) and as an id (item), unknown
    ids: the embeddings (the graph's `features`) equal the reference's, natively served."""
    request = _edge_request(model)
    data = encode_request(request)
    _assert_native_equals_python(processor, data, monkeypatch)
    served = _served(processor)
    status, body = processor.process(data)
    assert status == 200, body[:300]
    assert _served(processor) == served + 1
    got, want = decode_response(body), Reference(model.model_dir, model.checkpoint_dir).predict(request)
    np.testing.assert_array_equal(got["features"], want["features"])
    np.testing.assert_allclose(got["prob"], want["prob"], atol=1e-6, rtol=0)


def test_native_predict_keys_integer_ids_without_consuming_the_request(
    processor: Processor, model: IntVocabularyModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Processor.predict's native path (arrays, not bytes) keys a copy of the ids: the
    caller's arrays are left as they were and asking again gives the same answer."""
    request = _edge_request(model)
    kept = {k: v.copy() for k, v in request.items()}
    want = decode_response(_python_route(processor, encode_request(request), monkeypatch)[1])
    processor.predict(request)   # the layout's first: registered
    served = _served(processor)
    for _ in range(2):
        got = processor.predict(request)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
        for key, value in kept.items():
            np.testing.assert_array_equal(request[key], value)
    assert _served(processor) == served + 2


@pytest.mark.parametrize("form", ["content", "val", "fill"])
def test_tf_serving_requests_key_integer_ids_natively(processor: Processor, model: IntVocabularyModel,
                                                      form: str) -> None:
    """A tensorflow.serving.PredictRequest of the same ids (tensor_content, every *_val, or
    *_val filled by repeating its last id) is keyed natively too: the outputs are the bytes
    the Python route writes."""
    rng = np.random.default_rng(51)
    request = _edge_request(model)
    data = _tfs_request({name: _tensor(value, form, rng) for name, value in request.items()})
    got, moved = _tfs_native(processor, data)
    assert moved == {"served": 1}
    assert got == _tfs_python_route(processor, data)


def test_integer_keys_spec() -> None:
    """The lists the model uses, keyed by the Python spec the native route is held to."""
    ids = np.array([42, 7, -1, 1 << 33, -5, 0, 2, 1 << 32, (1 << 62) + 3, INT64_MIN, INT64_MAX], dtype=np.int64)
    assert IntegerKeys(SHOPS).keys(ids).tolist() == [4, 0, -1, 2, 3, 6, -1, -1, 10, -1, -1]
    assert IntegerKeys(SHOPS, padding=False).keys(ids).tolist() == [4, 0, 8, 2, 3, 6, -1, -1, 10, -1, -1]
    assert IntegerKeys(BRANDS, default_id=1).keys(np.array([-1, 92, 2, 3])).tolist() == [-1, 4, 1, 0]
    assert IntegerKeys((), default_id=4).keys(np.array([-1, 0, 5])).tolist() == [-1, 4, 4]
    assert IntegerKeys((), default_id=4, padding=False).keys(np.array([-1, 0, 5])).tolist() == [4, 4, 4]


@pytest.mark.parametrize("padding", [True, False])
@pytest.mark.parametrize("default_id", [-1, 1])
def test_an_empty_integer_vocabulary_is_keyed_natively(
    model: IntVocabularyModel, monkeypatch: pytest.MonkeyPatch, padding: bool, default_id: int
) -> None:
    """model.json holds no empty integer vocabulary (it refuses one), but the native
    vocabulary is built from any IntegerKeys: `brand` given an empty one here keys every id
    default_id (-1 padding when `padding`), natively and in Python alike."""
    made = servable_module.binding_keys

    def keys(binding: EmbeddingBinding) -> object:
        if binding.input == "brand":
            return IntegerKeys((), default_id=default_id, padding=padding)
        return made(binding)

    monkeypatch.setattr(servable_module, "binding_keys", keys)
    p = Processor(model.config())
    try:
        request = _edge_request(model)
        before = _fallbacks(p)
        _assert_native_equals_python(p, encode_request(request), monkeypatch)
        assert _fallbacks(p) == {**before, "route_miss": before["route_miss"] + 1}
        features = decode_response(p.process(encode_request(request))[1])["features"]
        brand = features[:, 4 + 16:4 + 32]   # dense (4), shop (16), brand (16)
        keys = np.where((np.array(EDGE_IDS) == -1) & padding, -1, default_id)
        for key in set(keys.tolist()):   # rows of one key read one embedding
            rows = brand[keys == key]
            np.testing.assert_array_equal(rows, rows[:1].repeat(len(rows), axis=0))
    finally:
        p.close()


def test_threads_key_integer_ids_natively_while_versions_swap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each version builds its own native integer vocabularies; a swap frees the old
    servable's once its native requests end. Threads serving integer-vocabulary requests
    throughout get one version's answer or the other's, never a mix or a crash (run under
    ASan by `make test-sanitize`)."""
    model = build_int_vocabulary(tmp_path / "a", items=50)
    other = build_int_vocabulary(tmp_path / "b", items=50, seed=1)
    shutil.copytree(other.checkpoint_dir / "1", model.checkpoint_dir / "2")   # other rows
    p = Processor(model.config())
    try:
        rng = np.random.default_rng(41)
        requests = [encode_request(_edge_request(model))] + [encode_request(model.sample(b, rng)) for b in (1, 3, 16)]
        answers: dict[str, list[tuple[int, bytes]]] = {}
        for version in ("1", "2"):
            p.load_version(version)
            assert len(p._manager.current.native._vocabularies) == 3
            for r in requests:
                _assert_native_equals_python(p, r, monkeypatch)
            answers[version] = [_python_route(p, r, monkeypatch) for r in requests]
        assert answers["1"] != answers["2"]
        _serve_while_versions_swap(p, requests, answers, "integer-vocabulary callers")
    finally:
        p.close()
