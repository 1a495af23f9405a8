"""recserve's server: HTTP (FastAPI on uvicorn) and gRPC in one process (DESIGN §7).

`serve(config_path, host=..., http_port=..., grpc_port=...)` is what `recserve serve`
runs; docs/server.md lists the routes and metrics. `serve` is imported on first use, so
importing a helper module (e.g. `recserve.server.timeline`) does not register the KServe
v2 protobuf messages (package `inference`), which tritonclient.grpc also registers in
protobuf's default pool: the two cannot share a process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from recserve.server.launch import serve

__all__ = ["serve"]


def __getattr__(name: str) -> Any:
    if name == "serve":
        from recserve.server.launch import serve

        return serve
    raise AttributeError(f"module 'recserve.server' has no attribute {name!r}")
