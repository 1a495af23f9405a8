"""Admission control (recserve.server.admission): a bounded wait in front of each model; the
excess is answered at once with 503 + Retry-After instead of queueing until clients time out,
and requests whose client deadline passed are dropped, not run."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from recserve.server.admission import Admission, AdmittedHandler, OverloadedError
from recserve.wire.codec import decode_response, encode_request


def test_the_wait_is_bounded_in_count_and_time() -> None:
    admission = Admission("m", max_waiting=2, max_queue_seconds=0.05)
    first, second = admission.arrive(), admission.arrive()
    with pytest.raises(OverloadedError, match=r"2 requests are waiting \(max_queued_requests 2\)"):
        admission.arrive()
    admission.start(first)  # its turn came at once: runs
    assert admission.waiting == 1
    with pytest.raises(OverloadedError, match=r"waited \d+ ms for its turn \(max_queue_ms 50\); it was not run"):
        admission.start(second - 1.0)  # as if it had arrived a second earlier
    assert admission.waiting == 0
    arrived = admission.arrive()
    with pytest.raises(OverloadedError, match="deadline passed"):
        admission.start(arrived, deadline=time.monotonic() - 0.001)


def test_a_handler_that_never_ran_gives_its_place_back() -> None:
    admission = Admission("m", max_waiting=1, max_queue_seconds=1.0)
    handler = AdmittedHandler(lambda *args: (200, b""), admission, admission.arrive(), None)
    handler.settle()  # the model could not be leased: the handler never ran
    assert admission.waiting == 0
    ran = AdmittedHandler(lambda *args: (200, b"ok"), admission, admission.arrive(), None)
    assert ran() == (200, b"ok")
    ran.settle()
    assert admission.waiting == 0


def test_a_passed_client_deadline_is_dropped_with_retry_after(server, demo) -> None:
    body = encode_request(demo.sample_inputs(1, np.random.default_rng(0)))
    late = httpx.post(f"{server.url}/api/predict/default", content=body, headers={"X-Request-Timeout-Ms": "0"})
    assert late.status_code == 503
    assert late.headers["retry-after"] == "1"
    assert "deadline passed" in late.json()["error"] and "it was not run" in late.json()["error"]
    bad = httpx.post(f"{server.url}/api/predict/default", content=body, headers={"X-Request-Timeout-Ms": "soon"})
    assert bad.status_code == 400 and "X-Request-Timeout-Ms must be a number" in bad.json()["error"]
    ok = httpx.post(f"{server.url}/api/predict/default", content=body, headers={"X-Request-Timeout-Ms": "5000"})
    assert ok.status_code == 200


@pytest.mark.parametrize("inline_max_ms", ["1", "0"], ids=["on-the-loop", "on-worker-threads"])
def test_a_flood_gets_fast_refusals_and_the_admitted_answers_stay_exact(launch, demo, demo_processor,
                                                                       inline_max_ms) -> None:
    """Both ways a model runs: on the event loop, and on worker threads (where the fast lane
    refuses a request when the wait is full, and the admitted ones take the ASGI route)."""
    config = json.loads(demo.config_path.read_text()) | {"max_queued_requests": 4, "max_queue_ms": 1}
    server = launch(config, env={"RECSERVE_INLINE_MAX_MS": inline_max_ms})
    rng = np.random.default_rng(1)
    bodies = [encode_request(demo.sample_inputs(256, rng)) for _ in range(4)]
    wants = [decode_response(demo_processor.process(b)[1]) for b in bodies]

    def client(i: int) -> list[tuple[int, int, bytes, str]]:
        out = []
        with httpx.Client(timeout=30) as http:
            for k in range(15):
                r = http.post(f"{server.url}/api/predict/default", content=bodies[(i + k) % 4])
                out.append(((i + k) % 4, r.status_code, r.content, r.headers.get("retry-after", "")))
        return out

    with ThreadPoolExecutor(48) as pool:
        answers = [a for chunk in pool.map(client, range(48)) for a in chunk]
    statuses = [status for _, status, _, _ in answers]
    assert statuses.count(200) > 0 and statuses.count(503) > 0, statuses
    assert set(statuses) <= {200, 503}
    for which, status, content, retry_after in answers:
        if status == 200:
            got = decode_response(content)
            assert all(np.array_equal(got[k], wants[which][k]) for k in wants[which])
        else:
            assert retry_after == "1" and "overloaded" in json.loads(content)["error"]
