"""The fused wire path (recserve.processor.request_route): `Processor.process` serves every
request layout from the parser's values buffer once one request of that layout has passed
the signature's checks. Its answers must be the general path's, bytes for bytes."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from recserve import Processor
from recserve.export.demo import DemoModel
from recserve.processor.servable import Servable
from recserve.processor.trace import RequestTrace
from recserve.wire import codec
from recserve.wire.codec import decode_response, encode_request

pytestmark = pytest.mark.skipif(codec._native is None, reason="routes need the native parser (RECSERVE_PURE_PYTHON=1)")


@pytest.fixture
def served(demo: DemoModel) -> Iterator[Processor]:
    p = Processor(demo.config_path.read_text())
    yield p
    p.close()


def _python_predict(processor: Processor, inputs: dict[str, np.ndarray],
                    output_filter: list[str] | None = None) -> dict[str, np.ndarray]:
    """The Python route's predict (Servable.predict): Processor.predict takes routes too."""
    servable = processor._manager.current
    assert servable is not None
    return servable.predict(inputs, output_filter)


def _routes(processor: Processor) -> dict[bytes, object]:
    servable = processor._manager.current
    assert servable is not None
    return servable.routes


def _process(processor: Processor, inputs: dict[str, object], **kwargs: object) -> bytes:
    status, body = processor.process(encode_request(inputs, **kwargs))  # type: ignore[arg-type]
    assert status == 200, body.decode(errors="replace")
    return body


def _general_path(processor: Processor, data: bytes, monkeypatch: pytest.MonkeyPatch) -> bytes:
    with monkeypatch.context() as m:
        m.setattr(codec, "_native_parse", None)  # parse_request declines: decode + predict
        status, body = processor.process_python(data)  # and not the native route
    assert status == 200, body
    return body


def test_each_layout_is_routed_once_and_answers_like_the_general_path(
    served: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(3)
    for batch in (1, 2, 3, 1, 2, 3, 3):
        data = encode_request(demo.sample_inputs(batch, rng))
        status, routed = served.process(data)
        assert status == 200
        assert routed == _general_path(served, data, monkeypatch)
    assert len(_routes(served)) == 3  # one per batch size: the values never mattered


def test_requests_of_one_layout_get_their_own_values(served: Processor, demo: DemoModel) -> None:
    rng = np.random.default_rng(5)
    first, second = demo.sample_inputs(4, rng), demo.sample_inputs(4, rng)
    got_first, got_second = (decode_response(_process(served, r)) for r in (first, second))
    assert len(_routes(served)) == 1
    for got, inputs in ((got_first, first), (got_second, second)):
        want = served.predict(inputs)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    assert not np.array_equal(got_first["probabilities"], got_second["probabilities"])


def test_narrow_integers_halves_and_strings_are_routed(
    served: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = demo.sample_inputs(3, np.random.default_rng(8))
    inputs["user_id"] = np.array([-5, 7, 2**31 - 1], np.int32)          # int_val, sign-extended
    inputs["item_id"] = inputs["item_id"].astype(np.uint16)             # a narrow unsigned id
    inputs["age"] = np.array([[18], [40], [-3]], np.int16)              # safely cast to float32
    inputs["price"] = inputs["price"].astype(np.float16)
    inputs["city"] = np.array([b"Hangzhou", "東京".encode(), b""], dtype=object)  # b"": padding
    data = encode_request(inputs)
    routed = _process(served, inputs)
    assert len(_routes(served)) == 1
    assert routed == _general_path(served, data, monkeypatch)
    want = _python_predict(served, inputs)
    got = decode_response(routed)
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])


def test_tensor_names_and_output_filters_are_part_of_the_layout(
    served: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    inputs = demo.sample_inputs(2, np.random.default_rng(9))
    renamed = {("user_id:0" if k == "user_id" else k): v for k, v in inputs.items()}
    for request, output_filter in ((inputs, ["prob"]), (renamed, ["logits", "prob"]), (inputs, [])):
        data = encode_request(request, output_filter=output_filter)
        status, routed = served.process(data)
        assert status == 200
        assert routed == _general_path(served, data, monkeypatch)
        got = decode_response(routed)
        assert sorted(got) == sorted(output_filter or ["probabilities", "logits"])
        want = _python_predict(served, inputs, output_filter)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    assert len(_routes(served)) == 3


def test_invalid_layouts_are_refused_every_time_and_never_routed(served: Processor, demo: DemoModel) -> None:
    inputs = demo.sample_inputs(2, np.random.default_rng(10))
    float64_age = dict(inputs, age=inputs["age"].astype(np.float64))
    extra = dict(inputs, nope=np.array([1, 2], np.int64))
    short = dict(inputs, item_id=inputs["item_id"][:1])
    cases = [
        (float64_age, "input 'age': dtype float64 cannot be safely cast to float32; send float32"),
        (extra, "unknown input 'nope' for signature 'serving_default'; valid inputs are"),
        (short, "inconsistent batch size across inputs:"),
    ]
    for _ in range(2):
        for request, message in cases:
            status, body = served.process(encode_request(request))
            assert status == 400
            assert message in body.decode()
    assert _routes(served) == {}
    _process(served, inputs)
    assert len(_routes(served)) == 1


def test_the_route_cache_is_bounded(
    served: Processor, demo: DemoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Servable, "_MAX_ROUTES", 2)
    rng = np.random.default_rng(11)
    for batch in (1, 2, 3, 4, 5, 1):
        inputs = demo.sample_inputs(batch, rng)
        got = decode_response(_process(served, inputs))
        np.testing.assert_array_equal(got["probabilities"], served.predict(inputs)["probabilities"])
        assert len(_routes(served)) <= 2


def test_a_routed_request_is_traced(served: Processor, demo: DemoModel) -> None:
    data = encode_request(demo.sample_inputs(3, np.random.default_rng(12)))
    for _ in range(2):  # the first request builds the route, the second uses it
        trace = RequestTrace()
        assert served.process(data, trace=trace)[0] == 200
        assert [s.stage for s in trace.spans] == ["decode", "lookup", "run", "encode"]
        assert all(s.end_ns >= s.start_ns for s in trace.spans)
        assert trace.batch_size == 3
        assert trace.model_version == served.model_info()["version"]
