"""The floor of a Python HTTP server: a bare ASGI app under uvicorn (httptools, uvloop, as
recserve's) that reads the whole request body and answers fixed bytes.

    python -m benchmarks.peers.uvicorn_fixed PORT RESPONSE_FILE
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import uvicorn


def app_answering(response: bytes) -> Any:
    start = {"type": "http.response.start", "status": 200,
             "headers": [(b"content-type", b"application/octet-stream"), (b"content-length", b"%d" % len(response))]}
    body = {"type": "http.response.body", "body": response}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send(start)
        await send(body)
    return app


if __name__ == "__main__":
    uvicorn.run(app_answering(Path(sys.argv[2]).read_bytes()), host="127.0.0.1", port=int(sys.argv[1]),
                http="httptools", loop="uvloop", log_level="warning", access_log=False, lifespan="off")
