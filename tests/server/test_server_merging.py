"""Request merging in `recserve serve` (recserve.server.merging): EAS predictions sent at the
same moment run as one batch, every caller gets byte for byte its unmerged answer, a
malformed request fails alone, and deadlines stay per request; on the event loop and on
worker threads, over real sockets."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from recserve.wire.codec import encode_request
from tests.server.conftest import settled

# Requests wait up to this long for others: every request of a test is sent well within it,
# so they merge whatever the machine's load (the test asserts on the counter, not on time).
WAIT_MICROS = 400_000
MERGE_WAIT = {"max_batch_size": 64, "batch_timeout_micros": WAIT_MICROS, "max_queue_ms": 5_000}


def _metric(url: str, sample: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _merged_count(url: str) -> float:
    return _metric(url, 'recserve_merged_requests_total{model="default"}')


# What each answered request adds to the metrics, merged or not: its count, its rows, its stages.
_PER_REQUEST = ('recserve_requests_total{code="200",model="default",route="eas"}',
                'recserve_batch_size_count{model="default"}', 'recserve_stage_seconds_count{model="default",stage="run"}')


def _post_together(url: str, bodies: list[bytes], headers: list[dict[str, str]] | None = None) -> list[httpx.Response]:
    """Every body posted at once, one connection each."""
    start = threading.Barrier(len(bodies), timeout=30)

    def post(i: int) -> httpx.Response:
        with httpx.Client(timeout=30) as client:
            start.wait()
            return client.post(f"{url}/api/predict/default", content=bodies[i],
                               headers=headers[i] if headers else None)

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(post, range(len(bodies))))


@pytest.mark.parametrize("inline_max_ms", ["1", "0"], ids=["on-the-loop", "on-worker-threads"])
def test_merged_callers_get_exactly_their_unmerged_answers(launch, demo, demo_processor, inline_max_ms) -> None:
    config = json.loads(demo.config_path.read_text()) | MERGE_WAIT
    server = launch(config, env={"RECSERVE_INLINE_MAX_MS": inline_max_ms})
    rng = np.random.default_rng(4)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in (1, 4, 1, 2, 7, 1, 3, 1)]
    bodies.insert(4, encode_request(demo.sample_inputs(2, rng), signature_name="no_such_signature"))
    before = _merged_count(server.url)
    counted = [_metric(server.url, sample) for sample in _PER_REQUEST]
    rows = _metric(server.url, 'recserve_batch_size_sum{model="default"}')
    answers = _post_together(server.url, bodies)
    for body, answer in zip(bodies, answers):
        status, want = demo_processor.process(body)
        assert answer.status_code == status
        if status == 200:
            assert answer.content == want
            assert answer.headers["content-type"] == "application/octet-stream"
            assert answer.headers["x-recserve-model-version"]
        else:
            assert answer.json() == {"error": want.decode()}
    assert answers[4].status_code == 400 and "no_such_signature" in answers[4].json()["error"]
    assert _merged_count(server.url) - before >= 2  # at least one run held two requests or more
    # Every answered request counted once, with its own rows, as unmerged ones are.
    assert [_metric(server.url, sample) - was for sample, was in zip(_PER_REQUEST, counted)] == [8, 8, 8]
    assert _metric(server.url, 'recserve_batch_size_sum{model="default"}') - rows == 1 + 4 + 1 + 2 + 7 + 1 + 3 + 1


def test_a_deadline_passed_while_waiting_to_merge_fails_only_that_request(launch, demo, demo_processor) -> None:
    config = json.loads(demo.config_path.read_text()) | MERGE_WAIT
    server = launch(config)
    rng = np.random.default_rng(8)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in (2, 1, 3)]
    # The middle request's deadline passes long before the merge's wait ends.
    headers = [{}, {"X-Request-Timeout-Ms": "20"}, {}]
    answers = _post_together(server.url, bodies, headers)
    assert [a.status_code for a in answers] == [200, 503, 200]
    assert answers[1].headers["retry-after"] == "1" and "deadline passed" in answers[1].json()["error"]
    assert answers[0].content == demo_processor.process(bodies[0])[1]
    assert answers[2].content == demo_processor.process(bodies[2])[1]


def test_without_a_wait_an_idle_server_answers_at_once_and_pipelining_keeps_order(launch, demo, demo_processor) -> None:
    """batch_timeout_micros 0: nothing waits for company; requests pipelined in one write are
    answered in order (each waits for the one before it on its connection)."""
    import socket

    from tests.server.test_server_fast_lane import _read_response, _request

    config = json.loads(demo.config_path.read_text()) | {"max_batch_size": 64, "batch_timeout_micros": 0}
    server = launch(config)
    rng = np.random.default_rng(9)
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in (1, 3, 2)]
    url = f"{server.url}/api/predict/default"
    for body in bodies:
        answer = httpx.post(url, content=body, timeout=30)
        assert answer.status_code == 200 and answer.content == demo_processor.process(body)[1]
    # A chunked body takes the ASGI route (not the fast lane): merged there too.
    chunked = httpx.post(url, content=iter([bodies[1][:5], bodies[1][5:]]), timeout=30)
    assert chunked.status_code == 200 and chunked.content == demo_processor.process(bodies[1])[1]
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(b"".join(_request(b) for b in bodies))
        rest = b""
        for body in bodies:
            head, got, rest = _read_response(sock, rest)
            assert head.startswith(b"HTTP/1.1 200") and got == demo_processor.process(body)[1]


def test_a_full_wait_is_refused_when_the_headers_arrive(launch, demo, demo_processor) -> None:
    """One place in the wait, held by a request waiting to be merged: the next request is
    answered 503 as soon as its headers are in, before it sends any body; its body is then
    skipped and the connection serves the next request. A client that will not keep its
    connection gets Connection: close and the server's end of the stream."""
    import socket
    import time

    from tests.server.test_server_fast_lane import _read_response

    config = json.loads(demo.config_path.read_text()) | {
        "max_batch_size": 64, "batch_timeout_micros": 3_000_000, "max_queue_ms": 10_000, "max_queued_requests": 1}
    server = launch(config)
    body = encode_request(demo.sample_inputs(2, np.random.default_rng(12)))
    head_only = b"POST /api/predict/default HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n" % len(body)
    refusal = {"error": "model 'default' is overloaded: 1 requests are waiting (max_queued_requests 1); "
                        "retry later or on another replica"}
    with ThreadPoolExecutor(1) as pool, socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        waiting = pool.submit(httpx.post, f"{server.url}/api/predict/default", content=body, timeout=30)
        deadline = time.monotonic() + 2.5  # the first request waits 3 s to be merged
        while 'recserve_requests_waiting{model="default"} 1.0' not in httpx.get(f"{server.url}/metrics").text:
            assert time.monotonic() < deadline, "the first request never took its place in the wait"
        sock.sendall(head_only + b"\r\n")  # no body yet
        head, content, rest = _read_response(sock, b"")
        assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower(), head
        assert b"connection: close" not in head.lower() and json.loads(content) == refusal
        sock.sendall(body)  # skipped by the server
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as closing:
            closing.sendall(head_only + b"Connection: close\r\n\r\n")
            answer = b""
            while chunk := closing.recv(65536):  # to the server's end of the stream
                answer += chunk
        closed_head, closed_content = answer.split(b"\r\n\r\n", 1)
        assert closed_head.startswith(b"HTTP/1.1 503") and b"connection: close" in closed_head.lower()
        assert json.loads(closed_content) == refusal
        first = waiting.result(timeout=30)
        assert first.status_code == 200 and first.content == demo_processor.process(body)[1]
        sock.sendall(head_only + b"\r\n" + body)  # the same connection, the wait free again
        head, content, rest = _read_response(sock, rest)
        assert head.startswith(b"HTTP/1.1 200") and content == demo_processor.process(body)[1]
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'recserve_requests_total{code="503",model="default",route="eas"} 2.0' in metrics


def test_a_worker_pools_merged_requests_are_each_counted_once(launch, demo, demo_processor) -> None:
    # --workers: metrics reach prometheus_client's multiprocess files in bulk (pool_flush).
    server = launch(json.loads(demo.config_path.read_text()) | MERGE_WAIT, workers=2)
    rng = np.random.default_rng(12)
    batches = [1 + k % 3 for k in range(12)]
    bodies = [encode_request(demo.sample_inputs(b, rng)) for b in batches]
    before = _merged_count(server.url)
    counted = [_metric(server.url, sample) for sample in _PER_REQUEST]
    rows = _metric(server.url, 'recserve_batch_size_sum{model="default"}')
    answers = _post_together(server.url, bodies)
    for body, answer in zip(bodies, answers):
        assert answer.status_code == 200, answer.text
        assert answer.content == demo_processor.process(body)[1]
    # The other worker's requests reach this one's /metrics once it flushed them (0.5 s).
    def added() -> tuple[list[float], float]:
        return [_metric(server.url, sample) - was for sample, was in zip(_PER_REQUEST, counted)] + [
            _metric(server.url, 'recserve_batch_size_sum{model="default"}') - rows], _merged_count(server.url) - before

    want = [12, 12, 12, sum(batches)]
    counts, merged = settled(added, lambda got: got[0] == want and got[1] >= 2)
    assert counts == want
    assert merged >= 2
