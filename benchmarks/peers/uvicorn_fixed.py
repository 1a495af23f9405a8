"""The floor of a Python HTTP server: a bare ASGI app under uvicorn (httptools, uvloop, as
recserve's) that reads the whole request body and answers fixed bytes.

    python -m benchmarks.peers.uvicorn_fixed PORT RESPONSE_FILE [HANDLER_US]

With HANDLER_US, each request's handler first spends that many microseconds of its thread's
CPU (a busy loop): the same app doing as much work per request as a real handler, to see
what the server costs around a handler that takes that long. `GET /handler-cpu` answers
"<seconds spent in handlers> <requests>" so the caller can take the handlers' CPU out.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import uvicorn


def app_answering(response: bytes, handler_seconds: float = 0.0) -> Any:
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", b"%d" % len(response))]}
    body = {"type": "http.response.body", "body": response}
    spent = [0.0, 0]

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"] == "/handler-cpu":
            tally = b"%.9f %d" % (spent[0], spent[1])
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-length", b"%d" % len(tally))]})
            await send({"type": "http.response.body", "body": tally})
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        if handler_seconds:
            began = time.thread_time()
            while time.thread_time() - began < handler_seconds:
                pass
            spent[0] += time.thread_time() - began
            spent[1] += 1
        await send(start)
        await send(body)
    return app


if __name__ == "__main__":
    handler_us = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    uvicorn.run(app_answering(Path(sys.argv[2]).read_bytes(), handler_us / 1e6), host="127.0.0.1",
                port=int(sys.argv[1]), http="httptools", loop="uvloop", log_level="warning", access_log=False,
                lifespan="off")
