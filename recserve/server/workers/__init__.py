"""`recserve serve --workers N`: one leader, N worker processes, one copy of the tables.

The leader reserves the shared arena and forks a zygote before it starts a thread; the
zygote forks the workers; the leader then loads every model into the arena and hands each
version to the workers (leader.py), which serve it over HTTP and gRPC on shared ports
(follower.py). Tables in Redis are read by every worker as by any replica (a local cache
each); tables on DRAM + SSD tiers cannot be shared between processes yet.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Sequence
from functools import partial

from recserve.config import ProcessorConfig
from recserve.errors import ConfigError, RecserveError
from recserve.processor.processor import Processor
from recserve.server.registry import ModelRegistry

__all__ = ["serve_pool"]

log = logging.getLogger("recserve.server")


def check_supported(configs: Sequence[tuple[str, ProcessorConfig]]) -> None:
    for name, config in configs:
        if config.ev_storage_type == 12:
            raise ConfigError(
                f"model {name!r} keeps its tables on DRAM + SSD tiers (ev_storage_type 12): worker "
                "processes share in-memory tables only so far; serve it with --workers 1", field="workers")


def _claim_port(host: str, port: int, what: str) -> socket.socket:
    """Bind the port shareably now, so a port another program holds fails at startup, not
    in every worker; the workers bind their own listeners beside it."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RecserveError(f"cannot listen for {what} on {host}:{port}: {exc.strerror}") from exc
    return sock


def _worker_main(index: int, replacement: bool, *, address: str, authkey: bytes, configs: Sequence[tuple[str, ProcessorConfig]],
                 host: str, http_port: int, grpc_port: int) -> int:
    from recserve.embedding import shared_memory
    from recserve.server.runner import run_server
    from recserve.server.workers.follower import FollowerProcessor, PoolClient

    shared_memory.detach(index)
    os.environ["RECSERVE_WORKER_INDEX"] = str(index)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(logging.Formatter(f"%(asctime)s %(levelname)s %(name)s [worker {index}]: %(message)s"))
    try:
        pool = PoolClient(address, authkey, index)
        registry = ModelRegistry(
            configs, pool=pool, make_processor=lambda e: FollowerProcessor(pool, e.name, e.config, e.progress))
        pool.attach(registry)
        return run_server(configs, registry, host=host, http_port=http_port, grpc_port=grpc_port, reuse_port=True,
                          listen_when_ready=replacement)
    except RecserveError as exc:
        log.error("worker %d: %s", index, exc.message)
        return 2
    except Exception:
        log.exception("worker %d failed", index)
        return 1


def serve_pool(configs: Sequence[tuple[str, ProcessorConfig]], count: int, *, host: str, http_port: int,
               grpc_port: int) -> int:
    """Serve with `count` worker processes until SIGTERM/SIGINT; returns the exit code."""
    from recserve.embedding import shared_memory
    from recserve.server.workers import follower  # noqa: F401  (imported once, before the fork)
    from recserve.server.workers.leader import Leader
    from recserve.server.workers.zygote import Zygote

    check_supported(configs)
    claims = [_claim_port(host, http_port, "HTTP"), _claim_port(host, grpc_port, "gRPC")]
    control = tempfile.mkdtemp(prefix="recserve-pool-")
    try:
        shared_memory.reserve()
        address, authkey = os.path.join(control, "leader.sock"), os.urandom(32)
        for sock in claims:
            sock.set_inheritable(False)
        zygote = Zygote(partial(_worker_main, address=address, authkey=authkey, configs=configs, host=host,
                                http_port=http_port, grpc_port=grpc_port))

        def registry(publish: object) -> ModelRegistry:
            return ModelRegistry(configs, make_processor=lambda e: Processor(
                e.config, model_name=e.name, progress=e.progress, on_swap=publish))  # type: ignore[arg-type]

        leader = Leader(registry, count, zygote, address, authkey)
        log.info("recserve serving %s with %d worker processes: HTTP on %s:%d, gRPC on %s:%d",
                 ", ".join(name for name, _ in configs), count, host, http_port, host, grpc_port)
        return leader.run()
    finally:
        for sock in claims:
            sock.close()
        shutil.rmtree(control, ignore_errors=True)
