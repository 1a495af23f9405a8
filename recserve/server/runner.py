"""`run_server`: one process (or one worker of a pool) serving every model of a config over
HTTP and gRPC.

Startup: bind both ports (a taken port fails here, before any model
loads), then load the models on background threads (a pool's worker: load, then bind), so the server is live at once and
ready when every model is loaded. SIGTERM or SIGINT: readiness turns false (HTTP
/v2/health/ready 503, gRPC health NOT_SERVING), both servers stop accepting (HTTP: the
connections already in the kernel's accept queue are accepted and served, then the port is
closed, so later ones are refused rather than reset), requests already accepted finish
with `Connection: close` (up to `GRACE_SECONDS`; idle keep-alive connections close after
http_protocol.DRAIN_IDLE_SECONDS), then the processors close.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import grpc
import uvicorn
import uvloop

from recserve.config import ProcessorConfig
from recserve.errors import RecserveError
from recserve.server.context import ServerContext
from recserve.server.dispatch import Dispatcher
from recserve.server.grpc_front import FrontedGrpcServer, build_grpc_front_door
from recserve.server.http_accept import GreedyListener
from recserve.server.http_app import build_app
from recserve.server.http_fast_lane import FastLane
from recserve.server.http_protocol import ConnectionLimits, guarded_protocol
from recserve.server.inline_policy import InlinePolicy
from recserve.server.merging import RequestMerger
from recserve.server.metrics import ServerMetrics
from recserve.server.registry import ModelRegistry
from recserve.server.settings import GRACE_SECONDS, ServerSettings

__all__ = ["run_server"]

log = logging.getLogger("recserve.server")

# Threads running predictions, per protocol. Few: decode and lookup hold the GIL, and
# every extra runnable thread delays the event loop's turn (measured on 2 cores: 4 threads
# gave 1.5-2x the HTTP throughput of 32 and a quarter of the p99).
WORKERS = max(4, min(32, 2 * (os.cpu_count() or 1)))


class _Uvicorn(uvicorn.Server):
    """uvicorn's server without its own signal handling (serve() owns SIGTERM/SIGINT),
    listening through GreedyListener (recserve.server.http_accept) instead of the loop's
    own server."""

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state)

        loop = asyncio.get_running_loop()
        self.servers = [GreedyListener(sock, create_protocol, loop) for sock in sockets or []]  # type: ignore[misc]

    def stop_listening(self) -> None:
        """Close the listeners now (at the signal, not at uvicorn's next 0.1 s tick)."""
        for server in self.servers:
            server.close()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        # The connections the listeners accepted from their queues while closing get their
        # transports first, so uvicorn's shutdown asks them to finish too.
        self.stop_listening()
        for server in self.servers:
            await server.wait_closed()
        await super().shutdown(sockets=sockets)


def _listen(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:  # worker processes: one listener each, the kernel spreads connections
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    # Accepted connections inherit TCP_NODELAY (Linux). uvicorn writes a response's
    # headers and body separately; with Nagle the body waits for the client's delayed
    # ACK, ~40 ms per request.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RecserveError(f"cannot listen for HTTP on {host}:{port}: {exc.strerror}") from exc
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def run_server(
    configs: Sequence[tuple[str, ProcessorConfig]], models: ModelRegistry, *, host: str, http_port: int,
    grpc_port: int, reuse_port: bool = False, listen_when_ready: bool = False,
) -> int:
    """Serve `models` on both ports until SIGTERM/SIGINT (one process, or one worker of a pool)."""
    settings = ServerSettings.resolve([c for _, c in configs])
    metrics = ServerMetrics(models)
    workers = ThreadPoolExecutor(WORKERS, thread_name_prefix="recserve-http")
    inline = InlinePolicy(settings.inline_max_bytes, settings.inline_max_ms / 1000,
                          settings.inline_max_released_ms / 1000)
    dispatcher = Dispatcher(models, metrics)
    ctx = ServerContext(models=models, dispatcher=dispatcher, metrics=metrics, settings=settings, workers=workers,
                        inline=inline, merger=RequestMerger(dispatcher.call_merged, metrics, inline, workers))

    if listen_when_ready:
        # A worker replacing one that exited joins the shared ports only once it serves every
        # model: the kernel hands a listener its share of new connections at once, and a
        # worker still loading would answer them 503 while its siblings serve. (The pool's
        # first workers listen at once, like one process: the server is live while it loads.)
        models.start()
        while not models.locally_ready:
            time.sleep(0.02)
    http_socket = _listen(host, http_port, reuse_port=reuse_port)
    try:
        grpc_server = build_grpc_front_door(ctx, host, grpc_port, workers=WORKERS, reuse_port=reuse_port)
        grpc_server.start()  # calls before the models load are answered "loading", as HTTP's
    except (RuntimeError, RecserveError) as exc:
        http_socket.close()
        raise RecserveError(f"cannot listen for gRPC on {host}:{grpc_port}: {exc}") from exc
    limits = ConnectionLimits(settings.header_timeout_s, settings.body_timeout_s, settings.max_connections)
    http_server = _Uvicorn(uvicorn.Config(
        build_app(ctx), log_level="warning", access_log=False, lifespan="off",
        timeout_graceful_shutdown=int(GRACE_SECONDS), timeout_keep_alive=settings.keepalive_s,  # type: ignore[arg-type]
        http=guarded_protocol(limits, metrics.http_timeouts, metrics.connections_refused, FastLane(ctx),
                              lambda: models.draining),
    ))
    if not listen_when_ready:
        models.start()
    models.listening.set()  # HTTP's listener was bound and listening above
    log.info("recserve serving %s: HTTP on %s:%d, gRPC on %s:%d",
             ", ".join(models.names()), host, http_port, host, grpc_port)
    try:
        # uvloop: uvicorn picks it only when it creates the loop itself, and here serve()
        # does (the gRPC server and signals share it). Measured: ~20% less server CPU per request.
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(_run(http_server, http_socket, grpc_server, models))
    finally:
        workers.shutdown(wait=True)
        # After the last request (and the gRPC front end's last counts): a pool worker's
        # values reach the files the other processes read before this one exits.
        metrics.close()
        models.close()
    log.info("recserve stopped")
    return 0


async def _run(
    http_server: _Uvicorn, http_socket: socket.socket, grpc_server: grpc.Server | FrontedGrpcServer,
    models: ModelRegistry,
) -> None:
    loop = asyncio.get_running_loop()
    grpc_stopped = threading.Event()

    def stop() -> None:
        if models.draining:
            return
        log.info("shutting down: finishing requests in flight (up to %.0f s)", GRACE_SECONDS)
        models.start_draining()  # readiness first: not ready before the port closes
        http_server.stop_listening()
        http_server.should_exit = True
        # grpc's stop() refuses new RPCs at once and returns an event set when the
        # accepted ones have finished (or the grace ran out).
        done = grpc_server.stop(GRACE_SECONDS)

        def wait_for_grpc() -> None:
            done.wait()
            grpc_stopped.set()

        threading.Thread(target=wait_for_grpc, daemon=True).start()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop)
    await http_server.serve(sockets=[http_socket])
    stop()  # uvicorn may also have stopped on its own (startup failure)
    await loop.run_in_executor(None, grpc_stopped.wait)
