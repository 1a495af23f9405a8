"""Request semantics and every 400 case (DESIGN §3), through `process` (bytes, never
raises) and `predict` (raises recserve.errors.RequestError)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from recserve import Processor
from recserve.errors import RequestError
from recserve.wire.codec import decode_response, encode_request
from tests.threads import Threads

ALL_INPUTS = "['age', 'city', 'clicked_items', 'hour', 'item_category', 'item_id', 'price', 'query_category', 'user_id']"


def _bad(processor: Processor, inputs: dict, message: str, **kwargs) -> None:
    """The same 400 and message on the bytes path and on the Python path."""
    status, body = processor.process(encode_request(inputs, **kwargs))
    assert (status, body.decode()) == (400, message)
    with pytest.raises(RequestError) as info:
        processor.predict(
            inputs,
            list(kwargs.get("output_filter", ())) or None,
            signature_name=kwargs.get("signature_name") or None,
        )
    assert info.value.status == 400 and info.value.message == message


def test_process_returns_predictions_equal_to_predict(processor: Processor, request_inputs) -> None:
    status, body = processor.process(encode_request(request_inputs))
    assert status == 200
    got = decode_response(body)
    want = processor.predict(request_inputs)
    assert set(got) == {"probabilities", "logits"}
    for key in want:
        np.testing.assert_array_equal(got[key], want[key])
        assert got[key].shape == (3, 1)


def test_empty_request_describes_the_signature(processor: Processor) -> None:
    status, body = processor.process(b"")
    assert status == 200
    doc = json.loads(body)
    assert doc["signature_name"] == "serving_default"
    assert doc["inputs"]["clicked_items"] == {"name": "clicked_items", "dtype": "int64", "shape": [-1, -1]}
    assert doc["inputs"]["city"]["dtype"] == "string"
    assert doc["outputs"]["probabilities"] == {"name": "prob", "dtype": "float32", "shape": [-1, 1]}


def test_output_filter_by_alias_and_by_tensor_name(processor: Processor, request_inputs) -> None:
    full = processor.predict(request_inputs)
    status, body = processor.process(encode_request(request_inputs, output_filter=["prob:0"]))
    assert status == 200
    got = decode_response(body)
    assert list(got) == ["prob:0"]
    np.testing.assert_array_equal(got["prob:0"], full["probabilities"])
    only = processor.predict(request_inputs, ["logits"])
    assert list(only) == ["logits"]


def test_tensor_names_and_narrower_ints_are_accepted(processor: Processor, request_inputs) -> None:
    want = processor.predict(request_inputs)
    renamed = dict(request_inputs)
    renamed["user_id:0"] = renamed.pop("user_id").astype(np.int32)  # int32 -> int64 is safe
    got = processor.predict(renamed)
    np.testing.assert_array_equal(got["probabilities"], want["probabilities"])


def test_garbage_bytes(processor: Processor) -> None:
    status, body = processor.process(b"\xff\xff\xff\xff garbage")
    assert (status, body.decode()) == (
        400,
        ("request is not a valid tensorflow.eas.PredictRequest (12 bytes): "
        "Error parsing message with type 'tensorflow.eas.PredictRequest': Wire format was corrupt"),
    )


def test_unknown_input(processor: Processor, request_inputs) -> None:
    request_inputs["user"] = request_inputs["user_id"]
    _bad(processor, request_inputs,
         f"unknown input 'user' for signature 'serving_default'; valid inputs are {ALL_INPUTS}")


def test_missing_input(processor: Processor, request_inputs) -> None:
    del request_inputs["age"], request_inputs["city"]
    _bad(processor, request_inputs,
         f"missing input(s) ['age', 'city'] for signature 'serving_default'; it needs {ALL_INPUTS}")


def test_dtype_that_cannot_be_safely_cast(processor: Processor, request_inputs) -> None:
    request_inputs["age"] = request_inputs["age"].astype(np.float64)
    _bad(processor, request_inputs,
         "input 'age': dtype float64 cannot be safely cast to float32; send float32")


def test_float_ids_are_refused(processor: Processor, request_inputs) -> None:
    request_inputs["user_id"] = request_inputs["user_id"].astype(np.float32)
    _bad(processor, request_inputs,
         "input 'user_id': dtype float32 cannot be safely cast to int64; send int64 or a narrower integer type")


def test_numbers_for_a_string_feature_are_refused(processor: Processor, request_inputs) -> None:
    request_inputs["city"] = np.array([1, 2, 3], np.int64)
    _bad(processor, request_inputs, "input 'city': expects strings, got int64")


def test_wrong_rank(processor: Processor, request_inputs) -> None:
    request_inputs["age"] = request_inputs["age"].reshape(-1)
    _bad(processor, request_inputs, "input 'age': shape [3] does not match [?, 1] (? is any size)")


def test_wrong_fixed_dimension(processor: Processor, request_inputs) -> None:
    request_inputs["price"] = np.zeros((3, 2), np.float32)
    _bad(processor, request_inputs, "input 'price': shape [3, 2] does not match [?, 1] (? is any size)")


def test_inconsistent_batch(processor: Processor, request_inputs) -> None:
    request_inputs["item_id"] = request_inputs["item_id"][:2]
    _bad(processor, request_inputs,
         "inconsistent batch size across inputs: 'age' has 3, 'city' has 3, 'clicked_items' has 3, "
         "'hour' has 3, 'item_category' has 3, 'item_id' has 2, 'price' has 3, 'query_category' has 3, "
         "'user_id' has 3")


def test_unknown_output(processor: Processor, request_inputs) -> None:
    _bad(processor, request_inputs,
         "unknown output 'score' in output_filter for signature 'serving_default'; "
         "valid outputs are ['logits', 'probabilities']",
         output_filter=["score"])


def test_unknown_signature(processor: Processor, request_inputs) -> None:
    _bad(processor, request_inputs,
         "unknown signature_name 'predict'; this model has ['serving_default']",
         signature_name="predict")


def test_input_given_twice(processor: Processor, request_inputs) -> None:
    request_inputs["user_id:0"] = request_inputs["user_id"]
    _bad(processor, request_inputs, "input 'user_id' is given twice (as an alias and as a tensor name)")


def test_element_count_differs_from_shape(processor: Processor, request_inputs) -> None:
    from recserve.proto import predict_pb2

    request = predict_pb2.PredictRequest.FromString(encode_request(request_inputs))
    request.inputs["age"].float_val.append(1.0)  # 4 values for shape [3, 1]
    status, body = processor.process(request.SerializeToString())
    assert status == 400
    assert body.decode() == "input 'age': shape [3, 1] needs 3 values, got 4"


def test_processor_keeps_serving_after_errors(processor: Processor, request_inputs) -> None:
    for junk in (b"\x00", b"\x0a\x05hello", b"\xff" * 64):
        assert processor.process(junk)[0] == 400
    assert processor.process(encode_request(request_inputs))[0] == 200


def test_model_info_reports_the_served_version_and_tables(processor: Processor, demo) -> None:
    info = processor.model_info()
    assert info["version"] == "1" and info["global_step"] == 1 and info["ready"] is True
    assert info["model_path"] == str(demo.checkpoint_dir)
    from recserve.export.demo import demo_tables

    assert info["tables"] == {name: {"rows": len(t.keys)} for name, t in demo_tables().items()}
    assert info["last_error"] is None


def test_model_info_while_versions_swap_reads_only_live_tables(tmp_path) -> None:
    """model_info() reads the served version's table sizes; a swap may retire that version
    meanwhile and free its tables once its last lease ends. Read unleased, a worker process
    died of SIGSEGV in a status request (the sanitizer build sees the use after free here)."""
    import threading

    from recserve.export import write_checkpoint
    from recserve.export.demo import demo_tables, write_demo

    demo = write_demo(tmp_path / "demo")
    tables = demo_tables()
    want = {name: {"rows": len(t.keys)} for name, t in tables.items()}
    processor = Processor({**demo.config(), "model_update_interval_seconds": 0.02})
    done, stop = threading.Event(), threading.Event()

    def publish() -> None:
        try:
            for step in range(2, 26):
                if stop.is_set():
                    return
                write_checkpoint(demo.checkpoint_dir, tables, global_step=step)
                deadline = time.monotonic() + 30
                while processor.model_info()["version"] != str(step) and time.monotonic() < deadline:
                    time.sleep(0.005)
        finally:
            done.set()  # a publisher that failed ends the reads too; join re-raises its error

    writer = Threads([publish], "the checkpoint publisher")
    try:
        seen = set()
        deadline = time.monotonic() + 600
        while not done.is_set():
            assert time.monotonic() < deadline, "the publisher did not finish 24 versions in 600 s"
            info = processor.model_info()
            assert info["tables"] == want
            seen.add(info["version"])
        writer.join(timeout=60)
        assert len(seen) > 10  # reads really spanned many swaps
        assert processor.model_info()["version"] == "25"
    finally:
        stop.set()
        try:
            writer.join(timeout=60)
        finally:
            processor.close()
