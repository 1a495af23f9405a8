"""Errors through the C ABI: every bad request, argument and config gets the documented
status and message, and the host process keeps running."""

from __future__ import annotations

import json

import numpy as np
import pytest

from recserve import Processor
from recserve.errors import RecserveError
from recserve.wire.codec import encode_request


def test_bad_requests_get_400_with_the_python_message(client, demo, processor) -> None:
    inputs = demo.sample_inputs(2, np.random.default_rng(5))
    requests = {
        "garbage": b"\xff\xff\xff\xff not a PredictRequest",
        "unknown input": encode_request({**inputs, "no_such_input": np.ones(2, np.float32)}),
        "wrong dtype": encode_request({**inputs, "user_id": np.array([1.5, 2.5])}),
        "unknown output": encode_request(inputs, output_filter=("no_such_output",)),
        "valid afterwards": encode_request(inputs),
    }
    result = client.run(
        "once",
        demo.config_path,
        client.requests_file("errors.req", list(requests.values())),
        client.workdir / "errors.out",
    )
    assert result.returncode == 0, result.stderr
    replies = dict(zip(requests, client.read_replies("errors.out")))
    assert replies == {name: processor.process_python(r) for name, r in requests.items()}
    assert [status for status, _ in replies.values()] == [400, 400, 400, 400, 200]
    assert b"no_such_input" in replies["unknown input"][1]
    assert b"user_id" in replies["wrong dtype"][1]
    assert b"no_such_output" in replies["unknown output"][1]


def test_null_model_buf_and_bad_arguments(client) -> None:
    result = client.run("calls")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "process_null_model 400 model_buf is NULL: call initialize first",
        "info_null_model 400 model_buf is NULL: call initialize first",
        "batch_null_model 400 ",
        "batch_null_model[0] 400 model_buf is NULL: call initialize first",
        "batch_null_model[1] 400 model_buf is NULL: call initialize first",
        "process_null_output 400 ",
        "destroy_null 0 ",
        "initialize_null_config state -1 handle NULL",
    ]
    assert (
        result.stderr
        == "[recserve] initialize failed: model_config is NULL; pass the processor JSON config\n"
    )


@pytest.mark.parametrize(
    "config",
    [
        '{"savedmodel_dir": ',  # not JSON
        json.dumps({"no_such_field": 1}),  # unknown field
        json.dumps({"savedmodel_dir": "/nonexistent/model", "checkpoint_dir": "/nonexistent/ckpt"}),
    ],
    ids=["not-json", "unknown-field", "missing-model"],
)
def test_bad_config_sets_state_minus_1_and_prints_the_reason(client, config) -> None:
    with pytest.raises(RecserveError) as raised:
        Processor(config)
    result = client.run("init", client.config_file("bad_config.json", config))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "state -1 handle NULL signals_changed 0\n"
    assert f"[recserve] initialize failed: {raised.value.message}\n" in result.stderr
