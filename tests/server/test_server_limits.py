"""The HTTP front door under abuse, over real sockets: slow clients cut off, a bound on open
connections, and clients that go away counted without filling the log."""

from __future__ import annotations

import json
import re
import socket
import time

import httpx
import numpy as np

from recserve.wire.codec import encode_request

FAST = {"RECSERVE_HTTP_HEADER_TIMEOUT_S": "1", "RECSERVE_HTTP_BODY_TIMEOUT_S": "1"}


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics").text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? (\S+)$", text, re.MULTILINE))


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    return sock


def _closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed `sock` (EOF or reset), None if still open after `seconds`."""
    sock.settimeout(seconds)
    started = time.monotonic()
    try:
        while sock.recv(4096):
            pass
    except TimeoutError:
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def test_stalled_headers_and_bodies_are_closed_after_their_timeouts(launch, demo) -> None:
    server = launch(json.loads(demo.config_path.read_text()), env=FAST)
    stalled_headers = _connect(server.http_port)
    stalled_headers.sendall(b"POST /api/predict/default HTTP/1.1\r\nHost: x\r\nContent-Le")
    stalled_body = _connect(server.http_port)
    stalled_body.sendall(b"POST /api/predict/default HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n0123456789")
    silent = _connect(server.http_port)  # connects and never sends a byte
    for sock in (stalled_headers, stalled_body, silent):
        waited = _closed_within(sock, 10)
        assert waited is not None and waited < 5
        sock.close()
    assert _metric(server.url, "recserve_http_timeouts_total") >= 3
    # A client that keeps its pace is served as always.
    body = encode_request(demo.sample_inputs(2, np.random.default_rng(0)))
    assert httpx.post(f"{server.url}/api/predict/default", content=body).status_code == 200


def _served(sock: socket.socket) -> socket.socket:
    """`sock` once the server has accepted it and answered a request on it (kept alive)."""
    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(4096).startswith(b"HTTP/1.1 200"), "a held connection was not served"
    return sock


def test_connections_beyond_the_maximum_are_closed_at_once(launch, demo) -> None:
    server = launch(json.loads(demo.config_path.read_text()), env={"RECSERVE_HTTP_MAX_CONNECTIONS": "8"})
    held = [_served(_connect(server.http_port)) for _ in range(8)]  # all eight accepted and open
    extra = _connect(server.http_port)
    # "At once": long before the 10 s header timeout that would close an idle connection.
    waited = _closed_within(extra, 10)
    assert waited is not None and waited < 5
    for sock in held:
        sock.close()
    deadline = time.monotonic() + 30
    while _metric(server.url, "recserve_http_connections_refused_total") < 1:
        assert time.monotonic() < deadline, "no refused connection counted in 30 s"
        time.sleep(0.05)
    assert httpx.get(f"{server.url}/v2/health/ready").status_code == 200


def test_a_thousand_disconnects_are_counted_not_logged(launch, demo) -> None:
    server = launch(json.loads(demo.config_path.read_text()))
    lines_before = len(server.log().splitlines())
    for _ in range(1000):
        sock = _connect(server.http_port)
        sock.sendall(b"POST /api/predict/default HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n0123456789")
        sock.close()  # gone before the body's end: the prediction never runs
    deadline = time.monotonic() + 30
    while _metric(server.url, "recserve_client_disconnects_total") < 1000 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _metric(server.url, "recserve_client_disconnects_total") == 1000
    assert len(server.log().splitlines()) - lines_before < 20, server.log()[-3000:]
    assert _metric(server.url, "recserve_requests_total") == 0  # none of them reached a model
