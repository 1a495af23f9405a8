"""An HTTP proxy in front of an object store (moto's S3 server in the soak) that misbehaves
on demand: `mode` "pass" forwards every request; "error" answers object reads (GET) with a
500 S3 error; "slow" holds every answer for `delay` seconds; "truncate" sends a GET's headers
with the full Content-Length and then half the body, and closes the connection. Listings
and HEADs keep working in "error" and "truncate", as when one storage node is sick.

Thread-safe: `mode` may change while requests are in flight.
"""

from __future__ import annotations

import http.client
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["FaultProxy"]

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class FaultProxy:
    def __init__(self, upstream: str, delay: float = 2.0) -> None:
        self.mode = "pass"
        self.delay = delay
        self.served: dict[str, int] = {}
        target = urlsplit(upstream)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                mode = proxy.mode
                proxy.served[mode] = proxy.served.get(mode, 0) + 1
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                is_object_read = self.command == "GET" and "?" not in self.path.split("/", 2)[-1] \
                    and self.path.count("/") >= 2
                if mode == "error" and is_object_read:
                    payload = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code>'
                               b"<Message>injected by the soak</Message></Error>")
                    self.send_response(500)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if mode == "slow":
                    time.sleep(proxy.delay)
                upstream = http.client.HTTPConnection(target.hostname, target.port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status, answer.reason)
                for key, value in answer.getheaders():
                    # A HEAD's Content-Length is the object's size: passed on as it is.
                    if key.lower() not in _HOP and (key.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(key, value)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if mode == "truncate" and is_object_read and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
