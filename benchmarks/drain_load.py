"""Client loops against a server while it is stopped: how many requests a stop loses.

Two kinds of client, each a thread posting one request body in a loop until the port
refuses it: one opens a new connection per request, the other keeps its connection alive
(and reconnects when an answer says `Connection: close`). A request is

- answered: a 200 arrived;
- refused: the connection was refused before anything was sent (the port is closed; a load
  balancer or client retries it elsewhere, nothing was lost);
- failed: anything else, e.g. the connection was accepted and then reset, or closed before
  the answer, or another status than 200. A graceful stop has none (or one, when a
  handshake completes just as the listener closes).

The server tests and the image test (tests/image) use it; `python -m benchmarks.drain_load`
measures a running server: `--stop-command` is run once the loops have warmed up.
"""

from __future__ import annotations

import argparse
import http.client
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

__all__ = ["DrainResult", "drain_under_load"]


@dataclass
class DrainResult:
    answered_before: int = 0  # before the stop was sent
    answered_after: int = 0  # after it: in flight then, or queued, or on kept-alive connections
    refused: int = 0
    failed: list[str] = field(default_factory=list)  # one line per failed request
    told_to_close: int = 0  # keep-alive clients whose last answer said `Connection: close`
    keepalive_clients: int = 0

    def summary(self) -> str:
        return (f"answered {self.answered_before} before the stop and {self.answered_after} after, "
                f"{self.refused} refused, {len(self.failed)} failed, {self.told_to_close} of "
                f"{self.keepalive_clients} kept-alive connections told to close")


class _Counts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.result = DrainResult()
        self.stopped = False  # the stop was sent

    def answered(self) -> None:
        with self.lock:
            if self.stopped:
                self.result.answered_after += 1
            else:
                self.result.answered_before += 1


def _client(host: str, port: int, path: str, body: bytes, headers: dict[str, str], keep_alive: bool,
            counts: _Counts, give_up: threading.Event) -> None:
    conn: http.client.HTTPConnection | None = None
    last_said_close = False
    while not give_up.is_set():
        if conn is None:
            conn = http.client.HTTPConnection(host, port, timeout=60)
            try:
                conn.connect()
            except ConnectionRefusedError:
                with counts.lock:
                    counts.result.refused += 1
                    counts.result.told_to_close += keep_alive and last_said_close
                return
            except OSError as exc:  # the handshake raced the listener's close: a reset, counted
                with counts.lock:
                    counts.result.failed.append(f"new connection: connect: {exc!r}")
                conn.close()
                conn = None
                continue
        try:
            conn.request("POST", path, body, headers)
            response = conn.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as exc:
            with counts.lock:
                counts.result.failed.append(f"{'kept-alive' if keep_alive else 'new'} connection: {exc!r}")
            conn.close()
            conn = None
            continue
        if response.status != 200:
            with counts.lock:
                counts.result.failed.append(f"status {response.status}: {answer[:200]!r}")
        else:
            counts.answered()
        last_said_close = response.will_close
        if response.will_close or not keep_alive:
            conn.close()
            conn = None
    if conn is not None:
        conn.close()


def drain_under_load(url: str, body: bytes, stop: Callable[[], None], *,
                     headers: dict[str, str] | None = None, new_connection_clients: int = 3,
                     keepalive_clients: int = 3, warm_up: int = 30, timeout: float = 90.0) -> DrainResult:
    """Post `body` to `url` from the client loops; once they have `warm_up` answers, call
    `stop()` (e.g. send SIGTERM) and wait until the port refuses every client. RuntimeError
    when that takes longer than `timeout` seconds or no answer comes before the stop."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    counts = _Counts()
    counts.result.keepalive_clients = keepalive_clients
    give_up = threading.Event()
    errors: list[BaseException] = []

    def run(keep_alive: bool) -> None:
        try:
            _client(host, port, parts.path, body, dict(headers or {}), keep_alive, counts, give_up)
        except BaseException as exc:  # noqa: BLE001 -- a client's bug must fail the caller, not vanish with its thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(keep_alive,), daemon=True)
               for keep_alive in [False] * new_connection_clients + [True] * keepalive_clients]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    try:
        while counts.result.answered_before < warm_up:
            if errors or not any(t.is_alive() for t in threads) or time.monotonic() > deadline:
                raise RuntimeError(f"the clients did not warm up: {counts.result.summary()}; {errors}")
            time.sleep(0.01)
        with counts.lock:
            counts.stopped = True
        stop()
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(t.is_alive() for t in threads):
            raise RuntimeError(f"the port still accepted connections {timeout:.0f} s on: {counts.result.summary()}")
    finally:
        give_up.set()
    if errors:
        raise RuntimeError(f"a client loop crashed: {errors[0]!r}") from errors[0]
    return counts.result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="e.g. http://127.0.0.1:8080/api/predict/demo")
    parser.add_argument("--body", required=True, help="file holding the request body")
    parser.add_argument("--content-type", default="application/octet-stream")
    parser.add_argument("--stop-command", required=True, help="shell command that stops the server")
    args = parser.parse_args()
    with open(args.body, "rb") as f:
        body = f.read()
    result = drain_under_load(args.url, body, lambda: subprocess.run(args.stop_command, shell=True, check=True),
                              headers={"Content-Type": args.content_type})
    print(result.summary())
    for line in result.failed:
        print("  failed:", line)
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
