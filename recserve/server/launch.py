"""`serve`: what `recserve serve` runs — one process (runner.run_server), or a leader with
worker processes (workers.serve_pool) when `--workers` asks for more than one."""

from __future__ import annotations

from pathlib import Path

from recserve.config import parse_model_configs
from recserve.processor import heap
from recserve.server.registry import ModelRegistry
from recserve.server.runner import run_server
from recserve.server.worker_count import worker_count

__all__ = ["serve"]


def serve(config_path: str, *, host: str = "127.0.0.1", http_port: int = 8080, grpc_port: int = 8500,
          workers: int | str = 1) -> int:
    """Serve until SIGTERM/SIGINT; returns the exit code (0 after a graceful stop).
    Raises RecserveError (ConfigError, ...) when the config or a port is unusable.
    workers: N or "auto" worker processes sharing one copy of the tables (DESIGN §9)."""
    configs = parse_model_configs(Path(config_path))
    heap.limit_arenas()  # before the threads that allocate exist; forked workers inherit it
    count = worker_count(workers, [c for _, c in configs])
    if count > 1:
        from recserve.server.workers import serve_pool

        return serve_pool(configs, count, host=host, http_port=http_port, grpc_port=grpc_port)
    return run_server(configs, ModelRegistry(configs), host=host, http_port=http_port, grpc_port=grpc_port)
