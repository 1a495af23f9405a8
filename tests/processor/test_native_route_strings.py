"""String ids on the native request route: hash buckets (TensorFlow's farmhash64_mod), XXH64
and vocabularies are keyed in C (native/route.c, route_vocabulary.c), so the string-keyed
models a SavedModel conversion writes are served without Python. The spec is the Python
route (`Processor.process_python`): the native route's bytes must be its bytes, and both must
equal the independent reference (recserve.export.reference) on the same requests."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.models import VOCABULARY, StringKeyedModel, build_string_keyed
from recserve import Processor
from recserve.embedding import StringKeys
from recserve.export.reference import Reference
from recserve.wire import codec
from recserve.wire.codec import decode_response, encode_request
from tests.processor.test_native_route import (
    WAIT,
    _assert_native_equals_python,
    _python_route,
    _serve_while_versions_swap,
    _served,
)

pytestmark = pytest.mark.skipif(codec._native is None, reason="routes need the native parser (RECSERVE_PURE_PYTHON=1)")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> StringKeyedModel:
    return build_string_keyed(tmp_path_factory.mktemp("strings"), output_features=True)


@pytest.fixture(scope="module")
def processor(model: StringKeyedModel) -> Iterator[Processor]:
    p = Processor(model.config())
    yield p
    p.close()


def _fallbacks(processor: Processor) -> dict[str, int]:
    return processor.model_info()["native_route"]["fallbacks"]


def test_string_keyed_requests_are_served_natively_byte_for_byte(
    processor: Processor, model: StringKeyedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert processor.model_info()["native_route"]["enabled"]
    rng = np.random.default_rng(11)
    before = _fallbacks(processor)
    for batch in (1, 2, 3, 7, 64, 1, 64):   # repeats: the same layouts, new strings
        for _ in range(3):
            _assert_native_equals_python(processor, encode_request(model.sample(batch, rng)), monkeypatch)
    # Only each layout's first request (5 batch sizes) took Python, and registered the route
    # every later one of its layout took (a layout refused would miss on every request).
    assert _fallbacks(processor) == {**before, "route_miss": before["route_miss"] + 5}


def test_native_string_keys_match_the_reference(
    processor: Processor, model: StringKeyedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The embeddings themselves (the graph's `features` output): bucket, XXH64 and vocabulary
    keys, '' and unknown and non-UTF-8 strings, defaults of absent rows, pooled padding."""
    reference = Reference(model.model_dir, model.checkpoint_dir)
    rng = np.random.default_rng(12)
    for batch in (1, 5, 64):
        request = model.sample(batch, rng)
        data = encode_request(request)
        processor.process(data)                 # registers the layout's route
        served = _served(processor)
        status, body = processor.process(data)
        assert status == 200, body[:300]
        assert _served(processor) == served + 1
        got, want = decode_response(body), reference.predict(request)
        np.testing.assert_array_equal(got["features"], want["features"])
        np.testing.assert_allclose(got["prob"], want["prob"], atol=1e-6, rtol=0)


def test_edge_strings_are_keyed_as_python_keys_them(
    processor: Processor, model: StringKeyedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One request holding each awkward case in every string column."""
    words = [b"", b"\xff\xfe\xfd", b"\x00", "北京".encode(), b"news", b"sports", "café".encode(), b"caf\xc3",
             b"x" * 300, b"tag3", b"user-7", b"item-12", b"NEWS", b"news\x00"]
    batch = len(words)
    request = model.sample(batch, np.random.default_rng(13))
    column = np.array(words, dtype=object)
    for name in ("user", "item", "genre"):
        request[name] = column
    for name in ("tags", "topics"):
        grid = np.empty((batch, model.length), dtype=object)
        for row in range(batch):
            for j in range(model.length):
                grid[row, j] = words[(row + j) % batch] if j <= row % (model.length + 1) else b""
        request[name] = grid
    _assert_native_equals_python(processor, encode_request(request), monkeypatch)
    got = decode_response(processor.process(encode_request(request))[1])
    np.testing.assert_array_equal(got["features"], Reference(model.model_dir, model.checkpoint_dir)
                                  .predict(request)["features"])


def test_vocabulary_keys_follow_the_python_spec() -> None:
    """The list the model uses: a word listed twice keeps its last index, '' (listed at 7) is
    padding, unknown words and bytes that are not UTF-8 are padding."""
    keys = StringKeys(vocabulary=VOCABULARY)
    values = np.array([b"news", b"", b"games", b"\xff", "東京".encode(), b"nope"], dtype=object)
    assert keys.keys(values).tolist() == [6, -1, 8, -1, 4, -1]
    assert keys.indices == {w.encode(): i for i, w in enumerate(VOCABULARY) if w}


def test_a_string_layout_is_counted_natively_on_every_request_after_its_first(
    processor: Processor, model: StringKeyedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strings move no slots (each is a (start, length) pair), so requests of one shape share
    one layout whatever their strings: the first registers it, every later one is native."""
    rng = np.random.default_rng(14)
    before = _fallbacks(processor)
    assert processor.process(encode_request(model.sample(9, rng)))[0] == 200   # a new layout
    assert _fallbacks(processor) == {**before, "route_miss": before["route_miss"] + 1}
    served = _served(processor)
    for _ in range(5):
        data = encode_request(model.sample(9, rng))
        assert processor.process(data) == _python_route(processor, data, monkeypatch)
    assert _served(processor) == served + 5
    assert _fallbacks(processor) == {**before, "route_miss": before["route_miss"] + 1}


def test_a_new_version_builds_its_own_vocabulary_and_frees_the_old(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vocabularies belong to one version's native servable, built with it (not on a request
    thread): a swap serves the new version's and frees the old servable, vocabularies and all."""
    model = build_string_keyed(tmp_path / "a", output_features=True)
    other = build_string_keyed(tmp_path / "b", seed=1, output_features=True)
    p = Processor(model.config())
    try:
        old = p._manager.current.native
        assert len(old._vocabularies) == 2 and old.routes == 0   # genre and topics: one StringKeys each
        data = encode_request(model.sample(4, np.random.default_rng(15)))
        _assert_native_equals_python(p, data, monkeypatch)
        first = p.process(data)
        assert p.model_info()["version"] == "1"
        shutil.copytree(other.checkpoint_dir / "1", model.checkpoint_dir / "2")   # other rows
        p.load_version("2")
        assert p.model_info()["version"] == "2"
        for _ in range(int(WAIT / 0.05)):
            if old.address is None:
                break
            threading.Event().wait(0.05)
        assert old.address is None
        _assert_native_equals_python(p, data, monkeypatch)
        assert p.process(data) != first
        assert len(p._manager.current.native._vocabularies) == 2
    finally:
        p.close()


def test_threads_key_strings_natively_while_versions_swap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each swap frees the old version's vocabularies once its native requests end: threads
    serving string-keyed requests throughout get one version's answer or the other's, never
    a mix or a crash (run under ASan by `make test-sanitize`)."""
    model = build_string_keyed(tmp_path / "a")
    other = build_string_keyed(tmp_path / "b", seed=1)
    shutil.copytree(other.checkpoint_dir / "1", model.checkpoint_dir / "2")
    p = Processor(model.config())
    try:
        rng = np.random.default_rng(16)
        requests = [encode_request(model.sample(b, rng)) for b in (1, 3, 3, 16)]
        answers: dict[str, list[tuple[int, bytes]]] = {}
        for version in ("1", "2"):
            p.load_version(version)
            answers[version] = [_python_route(p, r, monkeypatch) for r in requests]
        assert answers["1"] != answers["2"]
        _serve_while_versions_swap(p, requests, answers, "string-keyed callers")
    finally:
        p.close()


@pytest.fixture(scope="module")
def keras_model(tmp_path_factory: pytest.TempPathFactory) -> StringKeyedModel:
    return build_string_keyed(tmp_path_factory.mktemp("keras_strings"), output_features=True, keras=True)


def test_keras_keying_is_native_too(keras_model: StringKeyedModel, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys as converted Keras layers have them ('' a string like any other, unknown words to
    OOV buckets or a default id, vocabularies starting past 0) are served natively, byte for
    byte the Python route's, with the embeddings the reference computes."""
    processor = Processor(keras_model.config())
    try:
        reference = Reference(keras_model.model_dir, keras_model.checkpoint_dir)
        rng = np.random.default_rng(21)
        before = _fallbacks(processor)
        for batch in (1, 5, 64, 1, 64):
            for _ in range(3):
                request = keras_model.sample(batch, rng)
                request["genre"][0] = b""          # '' is a word's place here, not padding
                request["user"][-1] = b""
                request["genre"][-1] = b"no such genre"
                data = encode_request(request)
                _assert_native_equals_python(processor, data, monkeypatch)
                got, want = decode_response(processor.process(data)[1]), reference.predict(request)
                np.testing.assert_array_equal(got["features"], want["features"])
        assert _fallbacks(processor) == {**before, "route_miss": before["route_miss"] + 3}
    finally:
        processor.close()
