"""`recserve perf` end to end: a real `recserve serve` subprocess on the demo model, the
command run as a user runs it, its table, JSON, PNG and exit codes."""

from __future__ import annotations

import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from recserve.export.demo import DemoModel
from recserve.warmup.warmup_file import write_warmup_file
from recserve.wire.codec import encode_request
from tests.perf.conftest import run_perf, served_requests
from tests.server.conftest import RunningServer, free_port

STAGES = {"decode", "lookup", "run", "encode", "server"}


def _png_pixels(path: Path) -> np.ndarray:
    """The PNG's pixels (8-bit RGB/RGBA, no interlace, as matplotlib writes), decoded here."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    offset, idat, width = 8, b"", 0
    while offset < len(data):
        (length,) = struct.unpack(">I", data[offset:offset + 4])
        kind, body = data[offset + 4:offset + 8], data[offset + 8:offset + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert depth == 8 and color in (2, 6)
            channels = 3 if color == 2 else 4
        elif kind == b"IDAT":
            idat += body
        offset += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels + 1
    rows = [raw[i * stride + 1:(i + 1) * stride] for i in range(height)]
    filters = {raw[i * stride] for i in range(height)}
    if filters != {0}:  # filtered rows: the bytes still vary with the picture; enough to tell blank from drawn
        return np.frombuffer(raw, np.uint8)
    return np.frombuffer(b"".join(rows), np.uint8).reshape(height, width, channels)


def test_perf_against_the_demo_prints_the_table_and_writes_json_and_png(
        perf_server: RunningServer, tmp_path: Path) -> None:
    before = served_requests(perf_server, "eas")
    out_json, out_png = tmp_path / "perf.json", tmp_path / "perf.png"
    done = run_perf("--url", perf_server.url, "--protocol", "eas-http", "--batch", "1,8",
                    "--concurrency", "1:2:x2", "--duration", "1s", "--warmup", "0.2s",
                    "--json", str(out_json), "--plot", str(out_png))
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0].split()
    assert header[:8] == ["batch", "conc", "req/s", "rows/s", "p50", "ms", "p90", "ms"]
    table_rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [(r[0], r[1]) for r in table_rows] == [("1", "1"), ("1", "2"), ("8", "1"), ("8", "2")]

    report = json.loads(out_json.read_text())
    assert report["format"] == "recserve.perf/1"
    assert report["target"] == {"url": perf_server.url, "protocol": "eas-http", "model": "default"}
    assert report["settings"]["requests"] == "synthesized"
    points = report["points"]
    assert [(p["batch"], p["concurrency"]) for p in points] == [(1, 1), (1, 2), (8, 1), (8, 2)]
    for p in points:
        assert p["errors"] == {} and p["requests"] > 0
        assert p["requests_per_s"] == pytest.approx(p["requests"] / p["duration_s"])
        assert p["rows_per_s"] == pytest.approx(p["requests_per_s"] * p["batch"])
        lat = p["latency_ms"]
        assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
        assert set(p["server_stages_ms"]) == STAGES and all(v > 0 for v in p["server_stages_ms"].values())
        assert p["server_stages_ms"]["server"] < lat["p99.9"]  # the server's part of what the client waited
        assert 0 < p["client_cpu"] < 1.5 and p["client_processes"] == min(p["concurrency"], p["client_processes"])
        assert p["cdf"][-1][1] == 1.0 and p["cdf"][-1][0] == pytest.approx(lat["max"], rel=1e-3)
        assert len(p["timeline"]) == 10 and sum(t["requests_per_s"] for t in p["timeline"]) > 0
    # every answer perf counted was a 200 the server counted on the EAS route (plus the
    # preflight, the signature request and the unmeasured warmup)
    assert served_requests(perf_server, "eas") - before >= sum(p["requests"] for p in points) + 1

    assert out_png.stat().st_size > 20_000
    pixels = _png_pixels(out_png)
    assert pixels.std() > 10  # a drawn chart, not a blank canvas


@pytest.mark.parametrize("protocol, route", [("kserve-http", "kserve"), ("tfserving", "tfserving"),
                                             ("eas-grpc", "eas_grpc"), ("kserve-grpc", "kserve_grpc"),
                                             ("tfserving-grpc", "tfserving_grpc")])
def test_every_protocol_reaches_its_route(perf_server: RunningServer, tmp_path: Path, protocol: str,
                                          route: str) -> None:
    url = perf_server.grpc_address if protocol.endswith("grpc") else perf_server.url
    before = served_requests(perf_server, route)
    out = tmp_path / "perf.json"
    done = run_perf("--url", url, "--protocol", protocol, "--batch", "4", "--concurrency", "2",
                    "--duration", "0.5s", "--warmup", "0s", "--json", str(out),
                    "--metrics-url", perf_server.url)
    assert done.returncode == 0, done.stderr
    (point,) = json.loads(out.read_text())["points"]
    assert point["errors"] == {} and point["requests"] > 0
    assert served_requests(perf_server, route) - before >= point["requests"]
    assert set(point["server_stages_ms"]) >= {"decode", "run", "server"}


def test_requests_from_a_file_keep_their_batch_and_errors_are_counted_by_status(
        perf_server: RunningServer, perf_demo: DemoModel, tmp_path: Path) -> None:
    good = encode_request(perf_demo.sample_inputs(3, np.random.default_rng(0)))
    bad = encode_request({"no_such_input": np.zeros(3, np.int64)})
    path = tmp_path / "requests.bin"
    write_warmup_file(path, [good, bad])
    out = tmp_path / "perf.json"
    done = run_perf("--url", perf_server.url, "--protocol", "eas-http", "--requests", str(path),
                    "--concurrency", "1", "--duration", "0.5s", "--warmup", "0s", "--json", str(out))
    assert done.returncode == 0, done.stderr
    (point,) = json.loads(out.read_text())["points"]
    assert point["batch"] == 3
    ok = point["requests"] - point["errors"]["400"]
    assert set(point["errors"]) == {"400"} and abs(ok - point["errors"]["400"]) <= 1  # they alternate
    assert point["rows_per_s"] == pytest.approx(ok * 3 / point["duration_s"])
    assert "400:" in done.stdout


def test_a_stopped_server_is_one_line_and_a_nonzero_exit() -> None:
    port = free_port()  # nothing listens there
    done = run_perf("--url", f"http://127.0.0.1:{port}", "--protocol", "eas-http", "--duration", "1s")
    assert done.returncode != 0
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("recserve: ")
    assert "Connection refused" in done.stderr and f"127.0.0.1:{port}" in done.stderr


@pytest.mark.parametrize("protocol, port_kind, expected", [
    ("eas-grpc", "http", "Trying to connect an http1.x server"),
    ("kserve-grpc", "http", "Trying to connect an http1.x server"),
    ("tfserving-grpc", "http", "Trying to connect an http1.x server"),
    ("eas-http", "grpc", "the answer is not HTTP/1.1"),
    ("tfserving", "grpc", "the answer is not HTTP/1.1"),
])
def test_a_wrong_protocol_is_one_line_and_a_nonzero_exit(perf_server: RunningServer, protocol: str,
                                                         port_kind: str, expected: str) -> None:
    address = f"127.0.0.1:{perf_server.http_port if port_kind == 'http' else perf_server.grpc_port}"
    url = address if protocol.endswith("grpc") else f"http://{address}"
    done = run_perf("--url", url, "--protocol", protocol, "--duration", "1s")
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("recserve: ")
    assert expected in done.stderr and "--protocol" in done.stderr


def test_a_wrong_model_name_names_what_is_served(perf_server: RunningServer) -> None:
    done = run_perf("--url", perf_server.url, "--protocol", "kserve-http", "--model", "nope")
    assert done.returncode != 0 and done.stderr.count("\n") == 1
    assert "404" in done.stderr and "'default'" in done.stderr
