"""Predictions answered inside the HTTP protocol (recserve.server.http_fast_lane) and the
listener that accepts every waiting connection at once (recserve.server.http_accept), over
real sockets against `recserve serve`."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import time

import httpx
import numpy as np

from recserve.server.http_accept import GreedyListener
from recserve.wire.codec import decode_response, encode_request


def _read_response(sock: socket.socket, buffer: bytes) -> tuple[bytes, bytes, bytes]:
    """(head, body, what follows) of the next response in `buffer` + what `sock` sends."""
    while b"\r\n\r\n" not in buffer:
        buffer += sock.recv(65536)
    head, rest = buffer.split(b"\r\n\r\n", 1)
    length = int(re.search(rb"(?im)^content-length: *(\d+)", head).group(1))
    while len(rest) < length:
        rest += sock.recv(65536)
    return head, rest[:length], rest[length:]


def _request(body: bytes, extra: bytes = b"") -> bytes:
    return (b"POST /api/predict/default HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)


def test_pipelined_requests_in_one_write_are_answered_in_order(server, demo, demo_processor) -> None:
    rng = np.random.default_rng(3)
    bodies = [encode_request(demo.sample_inputs(batch, rng)) for batch in (1, 3, 2)]
    url = f"{server.url}/api/predict/default"
    for _ in range(3):  # the model's run time is measured: later requests take the fast lane
        assert httpx.post(url, content=bodies[0]).status_code == 200
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(b"".join(_request(body) for body in bodies))
        rest = b""
        for body in bodies:
            head, answer, rest = _read_response(sock, rest)
            assert head.startswith(b"HTTP/1.1 200 ")
            assert b"x-recserve-model-version: " in head.lower()
            status, expected = demo_processor.process(body)
            assert status == 200
            ours, theirs = decode_response(answer), decode_response(expected)
            assert ours.keys() == theirs.keys()
            for name in ours:
                np.testing.assert_array_equal(ours[name], theirs[name])
        # Still open for more, as keep-alive promises.
        sock.sendall(_request(bodies[0]))
        head, _, _ = _read_response(sock, b"")
        assert head.startswith(b"HTTP/1.1 200 ")


def test_a_held_fast_lane_answer_goes_out_before_the_next_requests_asgi_answer(server, demo) -> None:
    # Fast-lane answers are written at the end of the loop's pass (write_coalescer); a request
    # pipelined behind one takes the ASGI route and must still be answered after it.
    body = encode_request(demo.sample_inputs(1, np.random.default_rng(6)))
    for _ in range(3):
        assert httpx.post(f"{server.url}/api/predict/default", content=body).status_code == 200
    ready = b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(_request(body) + ready + _request(body))
        first, _, rest = _read_response(sock, b"")
        second, health, rest = _read_response(sock, rest)
        third, _, _ = _read_response(sock, rest)
    assert b"application/octet-stream" in first.lower() and b"application/octet-stream" in third.lower()
    assert second.startswith(b"HTTP/1.1 200 ") and b"application/json" in second.lower(), (second, health)


def test_many_connections_answered_in_one_pass_all_get_their_answers(server, demo) -> None:
    rng = np.random.default_rng(7)
    bodies = [encode_request(demo.sample_inputs(1 + k % 3, rng)) for k in range(48)]
    for _ in range(3):
        assert httpx.post(f"{server.url}/api/predict/default", content=bodies[0]).status_code == 200
    socks = [socket.create_connection(("127.0.0.1", server.http_port), timeout=10) for _ in bodies]
    try:
        for sock, body in zip(socks, bodies):
            sock.sendall(_request(body))
        for k, sock in enumerate(socks):
            head, answer, _ = _read_response(sock, b"")
            assert head.startswith(b"HTTP/1.1 200 ")
            assert decode_response(answer)["probabilities"].shape[0] == 1 + k % 3  # its own rows
    finally:
        for sock in socks:
            sock.close()


def test_connection_close_is_answered_then_closed(server, demo) -> None:
    body = encode_request(demo.sample_inputs(1, np.random.default_rng(4)))
    for _ in range(3):
        httpx.post(f"{server.url}/api/predict/default", content=body)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        sock.sendall(_request(body, b"Connection: close\r\n"))
        head, _, rest = _read_response(sock, b"")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"connection: close" in head.lower()
        assert rest == b"" and sock.recv(10) == b""  # closed by the server


def test_a_bad_request_on_the_fast_lane_gets_the_routes_json_error(server, demo) -> None:
    body = encode_request(demo.sample_inputs(1, np.random.default_rng(5)))
    for _ in range(3):
        httpx.post(f"{server.url}/api/predict/default", content=body)
    answer = httpx.post(f"{server.url}/api/predict/default", content=body,
                        headers={"X-Request-Timeout-Ms": "soon"})
    assert answer.status_code == 400
    assert answer.json() == {"error": "X-Request-Timeout-Ms must be a number of milliseconds >= 0, got 'soon'"}
    garbage = httpx.post(f"{server.url}/api/predict/default", content=b"\xff\xff\xff")
    assert garbage.status_code == 400 and "error" in garbage.json()


def test_the_listener_accepts_every_waiting_connection_at_once() -> None:
    # libuv accepts one connection per loop iteration; a busy loop then lets a burst of new
    # clients wait one iteration each. One readiness must take them all.
    async def main() -> int:
        loop = asyncio.get_running_loop()
        made: list[asyncio.Protocol] = []
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        listening.listen(128)
        clients = [socket.create_connection(listening.getsockname()) for _ in range(50)]
        listener = GreedyListener(listening, lambda: made.append(asyncio.Protocol()) or made[-1], loop)
        listener._accept()  # one readiness
        for _ in range(3):
            await asyncio.sleep(0)  # the transports are made on the loop's next turns
        listener.close()
        await listener.wait_closed()
        for client in clients:
            client.close()
        listening.close()
        return len(made)

    assert asyncio.run(main()) == 50


def test_the_listener_pauses_when_out_of_file_descriptors_and_resumes() -> None:
    # Out of fds, accept() fails while the listener stays readable: the listener must pause
    # (not spin the loop) and take the waiting connections once fds are free again.
    import subprocess
    import sys

    script = r"""
import asyncio, resource, socket, time
from recserve.server import http_accept
from recserve.server.http_accept import GreedyListener
http_accept._RETRY_SECONDS = 0.3

async def main():
    loop = asyncio.get_running_loop()
    made = []
    listening = socket.socket(); listening.bind(("127.0.0.1", 0)); listening.listen(64)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    hogs = []
    try:
        while True:
            hogs.append(open("/dev/null"))
    except OSError:
        pass
    clients = []
    for _ in range(3):
        hogs.pop().close()
        clients.append(socket.create_connection(listening.getsockname()))
    listener = GreedyListener(listening, lambda: made.append(asyncio.Protocol()) or made[-1], loop)
    calls = [0]
    original = listener._accept
    def counting():
        calls[0] += 1
        original()
    listener._accept = counting
    loop.remove_reader(listening.fileno()); loop.add_reader(listening.fileno(), counting)
    await asyncio.sleep(0.5)  # out of fds: a failed accept, then a pause of 0.3 s between tries
    assert made == [] and calls[0] <= 3, (made, calls)  # a spinning loop makes thousands
    for hog in hogs[:20]:
        hog.close()
    deadline = time.monotonic() + 30
    while len(made) < 3 and time.monotonic() < deadline:  # resumed: every waiting connection taken
        await asyncio.sleep(0.05)
    assert len(made) == 3, made
    listener.close()
    print("ok")

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout + done.stderr[-2000:]


def _head_lines(head: bytes) -> list[bytes]:
    """A response head's lines but the date, which changes each second."""
    return [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]


def test_fast_lane_answers_are_the_asgi_routes_bytes(launch, demo) -> None:
    # A fresh server: each route's first request runs on a worker thread through the ASGI
    # app (its model's run time is not measured yet), the later ones on the fast lane (any
    # measured run time is short enough for the loop here).
    server = launch(json.loads(demo.config_path.read_text()), env={"RECSERVE_INLINE_MAX_MS": "10000"})
    inputs = demo.sample_inputs(2, np.random.default_rng(6))
    as_lists = {k: [v.decode() for v in a.tolist()] if a.dtype == object else a.tolist() for k, a in inputs.items()}
    v2_types = {"f": "FP32", "i": "INT64", "O": "BYTES"}
    bodies = {
        "/api/predict/default": encode_request(inputs),
        "/v1/models/default:predict": json.dumps({"inputs": as_lists}).encode(),
        "/v2/models/default/infer": json.dumps({"inputs": [
            {"name": k, "shape": list(a.shape), "datatype": v2_types[a.dtype.kind], "data": as_lists[k]}
            for k, a in inputs.items()]}).encode(),
    }
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        for path, body in bodies.items():
            answers = []
            for _ in range(4):
                sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (path.encode(), len(body),
                                                                                               body))
                head, answer, rest = _read_response(sock, b"")
                assert rest == b""
                answers.append((_head_lines(head), answer))
            assert answers[0][0][0] == b"HTTP/1.1 200 OK", answers[0]
            assert b"x-recserve-model-version: 1" in answers[0][0]
            for later in answers[1:]:
                assert later == answers[0], path
    text = httpx.get(f"{server.url}/metrics").text
    for route in ("eas", "tfserving", "kserve"):
        assert f'recserve_requests_total{{code="200",model="default",route="{route}"}} 4.0' in text


def test_an_idle_connection_is_closed_after_the_keepalive_once_answered_on_the_fast_lane(launch, demo) -> None:
    server = launch(json.loads(demo.config_path.read_text()),
                    env={"RECSERVE_HTTP_KEEPALIVE_S": "1", "RECSERVE_INLINE_MAX_MS": "10000"})
    body = encode_request(demo.sample_inputs(1, np.random.default_rng(7)))
    # The model's run time is measured: later requests take the fast lane.
    assert httpx.post(f"{server.url}/api/predict/default", content=body).status_code == 200
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as sock:
        for _ in range(3):  # each answer starts the keep-alive wait again: 0.6 s gaps are served
            sock.sendall(_request(body))
            head, _, rest = _read_response(sock, b"")
            assert head.startswith(b"HTTP/1.1 200 ") and rest == b""
            time.sleep(0.6)
        sock.settimeout(10)
        started = time.monotonic()
        assert sock.recv(10) == b""  # closed by the server once idle for its keep-alive
        assert time.monotonic() - started < 5
