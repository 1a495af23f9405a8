"""KServe v2 JSON request decoding: inputs converted together by datatype (kserve_json._ListedInputs)
decode to the same arrays, dtypes, shapes and order as each converted on its own, and a bad
input among them is named as before."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from recserve.errors import RequestError
from recserve.wire import kserve_json
from recserve.wire.kserve_datatypes import DATATYPE_NUMPY


def _decode(inputs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    return kserve_json.decode_http_request(json.dumps({"inputs": inputs}).encode(), None).inputs


def _alone(spec: dict[str, Any]) -> np.ndarray:
    """The array one input decodes to when it is the request's only one."""
    return _decode([spec])[spec["name"]]


def test_inputs_decode_as_each_alone_in_request_order():
    specs = [
        {"name": "dense", "shape": [2, 3], "datatype": "FP32", "data": [0.5, 1, 2.25, -3, 1e-7, 3.4e38]},
        {"name": "c0", "shape": [2], "datatype": "INT64", "data": [1, -(2 ** 63)]},
        {"name": "nested", "shape": [2, 2], "datatype": "INT64", "data": [[1, 2], [3, 4]]},  # nested: on its own
        {"name": "c1", "shape": [2, 1], "datatype": "INT64", "data": [7, 2 ** 63 - 1]},
        {"name": "flag", "shape": [2], "datatype": "BOOL", "data": [True, False]},
        {"name": "rank3", "shape": [1, 2, 1], "datatype": "FP64", "data": [0.1, 0.2]},
        {"name": "small", "shape": [3], "datatype": "INT32", "data": [1, 2, 3]},
        {"name": "city", "shape": [2], "datatype": "BYTES", "data": ["a", "bé"]},
        {"name": "empty", "shape": [0], "datatype": "INT64", "data": []},
        {"name": "c2", "shape": [2], "datatype": "INT64", "data": [3, 4], "parameters": {"note": "x"}},
        {"name": "dense2", "shape": [1, 2], "datatype": "FP32", "data": [9, 8]},
    ]
    decoded = _decode(specs)
    assert list(decoded) == [s["name"] for s in specs]
    for spec in specs:
        alone = _alone(spec)
        got = decoded[spec["name"]]
        assert got.dtype == alone.dtype and got.shape == alone.shape == tuple(spec["shape"]), spec["name"]
        np.testing.assert_array_equal(got, alone)
    np.testing.assert_array_equal(decoded["c1"], np.array([[7], [2 ** 63 - 1]], np.int64))
    np.testing.assert_array_equal(decoded["dense"], np.array([0.5, 1, 2.25, -3, 1e-7, 3.4e38], np.float32).reshape(2, 3))
    assert decoded["nested"].tolist() == [[1, 2], [3, 4]]


def test_a_name_given_twice_keeps_the_last():
    decoded = _decode([
        {"name": "a", "shape": [1], "datatype": "INT64", "data": [1]},
        {"name": "b", "shape": [1], "datatype": "INT64", "data": [2]},
        {"name": "a", "shape": [2], "datatype": "FP32", "data": [3, 4]},
        {"name": "b", "shape": [1], "datatype": "INT64", "data": [5]},
    ])
    assert list(decoded) == ["a", "b"]
    assert decoded["a"].dtype == np.float32 and decoded["a"].tolist() == [3, 4]
    assert decoded["b"].tolist() == [5]


@pytest.mark.parametrize(("bad", "message"), [
    ({"name": "x", "shape": [2], "datatype": "INT64", "data": [1, "z"]},
     "input 'x': data is not a list of INT64 values: invalid literal for int() with base 10: 'z'"),
    ({"name": "x", "shape": [2], "datatype": "INT64", "data": [1, [2]]},
     "input 'x': data is not a list of INT64 values: setting an array element with a sequence"),  # then numpy's words
    ({"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}, "input 'x': shape [2, 2] needs 4 values, got 3"),
    ({"name": "x", "shape": [-1, 2], "datatype": "FP32", "data": [1, 2]},
     "input 'x': shape must be a list of integers >= 0, got [-1, 2]"),
    ({"name": "x", "shape": [2.0], "datatype": "FP32", "data": [1, 2]},
     "input 'x': shape must be a list of integers >= 0, got [2.0]"),
    ({"name": "x", "shape": [True, 2], "datatype": "FP32", "data": [1, 2]},  # answered 500 before (numpy's TypeError)
     "input 'x': shape must be a list of integers >= 0, got [True, 2]"),
    ({"name": "x", "shape": [1], "datatype": "FP16X", "data": [1]},
     "input 'x': datatype 'FP16X' is not supported; supported: " + ", ".join(DATATYPE_NUMPY)),
    ({"name": "x", "shape": [1], "data": [1], "extra": 1},
     "input 'x': datatype is missing; supported: " + ", ".join(DATATYPE_NUMPY)),
    ({"name": "x", "shape": [1], "datatype": "INT64"}, "input 'x' has neither data nor parameters.binary_data_size"),
    ({"shape": [1], "datatype": "INT64", "data": [1], "nam": "x"},
     'each input needs "name", "shape", "datatype" and "data" (or binary_data_size)'),
])
def test_a_bad_input_among_good_ones_is_named(bad, message):
    good = [{"name": f"g{i}", "shape": [2], "datatype": "INT64", "data": [i, i + 1]} for i in range(3)]
    for at in (0, 2, 3):
        specs = good[:at] + [bad] + good[at:]
        with pytest.raises(RequestError) as caught:
            _decode(specs)
        assert caught.value.message.startswith(message)
