"""batch_process with dynamic batching on: the requests of one call are served concurrently,
so the batcher merges them into shared runs; each still gets its own status and reply."""

from __future__ import annotations

import json

import numpy as np

from recserve import Processor
from recserve.processor import cabi
from recserve.wire.codec import decode_response


def _batching_config(demo) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(demo.config_path.read_text()) | {"max_batch_size": 64, "batch_timeout_micros": 200_000}


def _assert_same_replies(got: list[tuple[int, bytes]], want: list[tuple[int, bytes]]) -> None:
    assert [s for s, _ in got] == [s for s, _ in want]
    for (status, body), (_, expected) in zip(got, want):
        if status != 200:
            assert body == expected  # the same message
            continue
        got_outputs, want_outputs = decode_response(body), decode_response(expected)
        assert got_outputs.keys() == want_outputs.keys()
        for name in want_outputs:  # a merged run may round differently in the last bit
            np.testing.assert_allclose(got_outputs[name], want_outputs[name], rtol=0, atol=1e-6)


def test_one_call_is_merged_into_shared_runs(demo, processor, make_requests) -> None:
    requests = [*make_requests(demo, 6, batch=3, seed=5), b"\xff\xff not a request"]
    batching = Processor(_batching_config(demo))
    try:
        runs: list[int] = []
        sessions = batching._manager.current.sessions
        original = sessions._run_on

        def counting(index, names, feeds):  # type: ignore[no-untyped-def]
            runs.append(next(iter(feeds.values())).shape[0])
            return original(index, names, feeds)

        sessions._run_on = counting
        sessions._batcher._run = counting
        replies = cabi.process_batch(batching, requests)
    finally:
        batching.close()
    _assert_same_replies(replies, [processor.process_python(r) for r in requests])
    assert 1 <= len(runs) < 6  # six valid requests, fewer runs: merged


def test_batch_process_from_c_with_batching_on(client, demo, processor, make_requests) -> None:
    requests = [*make_requests(demo, 5, batch=4, seed=6), b"\xff"]
    config = client.config_file("batching.json", json.dumps(_batching_config(demo)))
    result = client.run("batch", config, client.requests_file("merged.req", requests), client.workdir / "merged.out")
    assert result.returncode == 0, result.stderr
    _assert_same_replies(client.read_replies("merged.out"), [processor.process_python(r) for r in requests])
