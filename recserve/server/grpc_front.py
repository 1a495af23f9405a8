"""The gRPC port's front end: grpc++ in C++ (native/grpc_front.cc), in front of grpcio.

grpcio runs Python for every call, and its poller and worker threads hand the GIL back and
forth: beyond `Processor.process`, a Predict cost 1.37x what a grpcio server answering
fixed bytes costs (BENCHMARKS.md, bench_grpc). So the public gRPC port is grpc++'s: it
answers tensorflow.eas.PredictionService/Predict on the native route with no Python, and
forwards every other call -- other methods and services, and each Predict the native route
declines -- to recserve's grpcio server (grpc_services.build_grpc_server) on a private Unix
socket, whose answers, errors and metadata pass back unchanged. Without the library (grpc++
not installed when recserve was built) or with RECSERVE_GRPC_FRONT=0, grpcio listens on the
public port itself, as it always did.

Health's Check and Watch are answered there too, from the statuses Python reports (every
HealthService.WATCH_POLL_SECONDS and as shutdown begins): a grpcio sync server holds a
worker thread for each open Watch, and a few watching clients would have held every
thread the forwarded calls need.

Python is the control plane: `GrpcFront` tells the C++ side each model's route slot once
the model serves, whether its Predicts may be served natively (not while it has a timeline
or records warmup requests: both need Python's view of each request), the version name of
each native servable (its answers' `x-recserve-model-version`) and Health's statuses; and
it adds the natively served calls' counts into /metrics (`flush`: at each scrape and every
FLUSH_SECONDS, on a thread of its own in one process, on the metrics' flush thread in a
worker pool). Thread-safe.
"""

from __future__ import annotations

import ctypes
import logging
import os
import secrets
import threading
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from recserve.errors import RecserveError
from recserve.native_library import open_library
from recserve.processor import native_route
from recserve.processor.processor import Processor
from recserve.processor.trace import STAGES
from recserve.server import tfserving_grpc
from recserve.server.context import ServerContext
from recserve.server.grpc_services import SERVER_SERVICES, HealthService, build_grpc_server, call_limit
from recserve.server.metrics import BATCH_BUCKETS, LATENCY_BUCKETS, NativeCounts
from recserve.server.pool_flush import FLUSH_SECONDS
from recserve.server.tfserving_grpc import version_number

__all__ = ["FrontedGrpcServer", "GrpcFront", "available", "build_grpc_front_door"]

log = logging.getLogger("recserve.server")

# The natively served calls' route labels, as the Python servicers': by protocol, in
# grpc_front.cc's order (EAS, TF Serving).
ROUTES = ("eas_grpc", tfserving_grpc.ROUTE)

_p, _i64, _i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_P64 = ctypes.POINTER(ctypes.c_int64)


def _load() -> ctypes.CDLL | None:
    if os.environ.get("RECSERVE_GRPC_FRONT") == "0":
        return None
    path = Path(__file__).with_name("librecserve_grpc_front.so")
    if not path.exists():
        return None
    try:
        return open_library(path, "gRPC front end", {
            "rs_front_create": (_p, [_p, _p, _i64]),
            "rs_front_add_model": (_i64, [_p, ctypes.c_char_p, _P64, _i64, _P64, _i64]),
            "rs_front_set_slot": (None, [_p, _i64, _p]),
            "rs_front_set_native": (None, [_p, _i64, _i32]),
            "rs_front_label": (None, [_p, _i64, ctypes.c_char_p, _i64]),
            "rs_front_start": (_i64, [_p, ctypes.c_char_p, ctypes.c_char_p, _i32, _i64, ctypes.c_char_p, _i64]),
            "rs_front_stats": (_i64, [_p, _i64, _i32, _P64, _i64]),
            "rs_front_calls": (None, [_p, _P64]),
            "rs_front_add_service": (None, [_p, ctypes.c_char_p]),
            "rs_front_health": (None, [_p, _i32, ctypes.POINTER(ctypes.c_int32), _i32]),
            "rs_front_shutdown": (None, [_p, ctypes.c_double]),
            "rs_front_free": (None, [_p]),
        }, twin=False)
    except ImportError as exc:
        log.warning("the gRPC front end is unavailable (%s); grpcio serves the gRPC port alone", exc)
        return None


_LIB = _load()


def available() -> bool:
    """Whether the gRPC port gets the C++ front end (and the native route is there to serve)."""
    return _LIB is not None and native_route.route_process_address() != 0


# rs_front_stats's values: served, CPU, late; latency and 4 stages (buckets, +Inf, sum); rows.
_STATS_SIZE = 3 + 5 * (len(LATENCY_BUCKETS) + 2) + len(BATCH_BUCKETS) + 2


def _bounds(values: tuple[float, ...], scale: float) -> Any:
    return (ctypes.c_int64 * len(values))(*(round(v * scale) for v in values))


class GrpcFront:
    """The C++ server: made with the models, then `start`ed on the public address."""

    def __init__(self, ctx: ServerContext, max_in_flight: int) -> None:
        assert _LIB is not None
        self._lib = lib = _LIB
        self._ctx = ctx
        self._address = lib.rs_front_create(native_route.route_process_address(),
                                             native_route.route_process_address(tfs=True), max_in_flight)
        if not self._address:
            raise MemoryError("rs_front_create failed")
        latency, rows = _bounds(LATENCY_BUCKETS, 1e9), _bounds(BATCH_BUCKETS, 1)
        self._index: dict[str, int] = {}
        self._slots: dict[str, Any] = {}   # each model's RouteSlot, kept alive while C++ may call it
        self._last: dict[tuple[str, str], np.ndarray] = {}
        self._last_calls = np.zeros(2, np.int64)
        self._lock = threading.Lock()      # flush's
        self._stopped = threading.Event()
        for name, entry in ctx.models.entries.items():
            self._index[name] = lib.rs_front_add_model(self._address, name.encode(), latency, len(LATENCY_BUCKETS),
                                                       rows, len(BATCH_BUCKETS))
            for route in ROUTES:
                self._last[name, route] = np.zeros(_STATS_SIZE, np.int64)
            entry.when_serving(lambda processor, name=name: self._serving(name, processor))
            entry.when_recording_changes(lambda name=name: self._natively(name))
            self._natively(name)
        native_route.watch_versions(self._label)
        self._flushed_for_us = ctx.metrics.counted_elsewhere(self.flush)  # a worker pool's thread calls it
        for service in SERVER_SERVICES:
            lib.rs_front_add_service(self._address, service.encode())
        self._health_lock = threading.Lock()
        self.push_health()

    def _serving(self, name: str, processor: Processor) -> None:
        slot = processor.route_slot
        if slot.address:
            self._slots[name] = slot
            self._lib.rs_front_set_slot(self._address, self._index[name], slot.address)

    def _natively(self, name: str) -> None:
        """A timeline needs ONNX Runtime profiles and a recording sees each request: both
        are Python's, so such a model's Predicts are forwarded. So are those of a model that
        batches dynamically (max_batch_size > 0): its batcher is Python, and a call waiting
        in it would hold one of grpc++'s threads for the batch's timeout."""
        entry = self._ctx.models.entries[name]
        on = entry.timeline is None and not entry.recording and entry.config.max_batch_size == 0
        self._lib.rs_front_set_native(self._address, self._index[name], int(on))

    def _label(self, servable_id: int, version: str, global_step: int) -> None:
        self._lib.rs_front_label(self._address, servable_id, version.encode(), version_number(version, global_step))

    def start(self, address: str, upstream: str, *, reuse_port: bool) -> int:
        """Listen on `address` (host:port), forwarding to the grpcio server at `upstream`;
        the port bound. RecserveError when the port cannot be had."""
        err = ctypes.create_string_buffer(512)
        port = self._lib.rs_front_start(self._address, address.encode(), upstream.encode(), int(reuse_port),
                                        self._ctx.settings.max_request_bytes, err, len(err))
        if port < 0:
            raise RecserveError(err.value.decode())
        if not self._flushed_for_us:
            threading.Thread(target=self._flush_loop, name="recserve-grpc-front-metrics", daemon=True).start()
        threading.Thread(target=self._health_loop, name="recserve-grpc-front-health", daemon=True).start()
        return int(port)

    def push_health(self) -> None:
        """Tell the C++ side what grpc.health.v1 answers now (HealthService's statuses): it
        answers Check SERVING and keeps the Watch streams without a Python thread held by
        each (grpcio's sync server held a worker thread per open Watch). Each report also
        gives a new watch still waiting its first status (one not SERVING yet) that status."""
        models = self._ctx.models
        with self._health_lock:
            draining = models.draining  # before the statuses, as HealthService.Watch reads them
            ready = [int(models.entries[name].ready) for name in self._index]
            self._lib.rs_front_health(self._address, int(models.ready), (ctypes.c_int32 * len(ready))(*ready),
                                      int(draining))

    def _health_loop(self) -> None:
        while not self._stopped.is_set():
            draining = self._ctx.models.wait_draining(HealthService.WATCH_POLL_SECONDS)
            self.push_health()
            if draining:
                return

    def _flush_loop(self) -> None:
        while not self._stopped.wait(FLUSH_SECONDS):
            self.flush()

    def flush(self) -> None:
        """Add what the C++ side served since the last flush to the server's metrics."""
        with self._lock:
            for name, index in self._index.items():
                for protocol, route in enumerate(ROUTES):
                    now = np.zeros(_STATS_SIZE, np.int64)
                    self._lib.rs_front_stats(self._address, index, protocol, now.ctypes.data_as(_P64), _STATS_SIZE)
                    delta, self._last[name, route] = now - self._last[name, route], now
                    if delta.any():
                        self._ctx.metrics.add_native(name, route, _counts(delta))
                        self._ctx.metrics.grpc_front_calls.labels("native").inc(int(delta[0]))
            calls = np.zeros(2, np.int64)
            self._lib.rs_front_calls(self._address, calls.ctypes.data_as(_P64))
            delta, self._last_calls = calls - self._last_calls, calls
            for path, n in zip(("forwarded", "refused"), delta):
                if n:
                    self._ctx.metrics.grpc_front_calls.labels(path).inc(int(n))

    def shutdown(self, grace_seconds: float) -> None:
        """Stop listening; calls in flight get `grace_seconds`, then are cancelled."""
        self._lib.rs_front_shutdown(self._address, grace_seconds)
        self._stopped.set()
        self.flush()


def _counts(delta: np.ndarray) -> NativeCounts:
    """rs_front_stats's layout (native/grpc_front.cc) as NativeCounts, times in seconds."""
    at = 3
    n_latency = len(LATENCY_BUCKETS) + 1

    def histogram(scale: float) -> tuple[list[int], float]:
        nonlocal at
        counts, total = delta[at:at + n_latency], delta[at + n_latency]
        at += n_latency + 1
        return [int(c) for c in counts], float(total) * scale

    latency = histogram(1e-9)
    stages = [histogram(1e-9) for _ in STAGES]
    n_rows = len(BATCH_BUCKETS) + 1
    rows = [int(c) for c in delta[at:at + n_rows]], float(delta[at + n_rows])
    return NativeCounts(served=int(delta[0]), cpu_seconds=float(delta[1]) * 1e-9, late=int(delta[2]),
                        latency=latency, stages=stages, rows=rows)


class FrontedGrpcServer:
    """grpcio on a private Unix socket behind the C++ front end on the public port: what
    runner.run_server starts and stops (a grpc.Server's start/stop)."""

    def __init__(self, front: GrpcFront, inner: grpc.Server, upstream: str, address: str, reuse_port: bool) -> None:
        self._front = front
        self._inner = inner
        self._upstream = upstream
        self._address = address
        self._reuse_port = reuse_port

    def start(self) -> None:
        """grpcio first: the front end forwards to it from its first call (a channel that
        finds nothing listening backs off before trying again)."""
        self._inner.start()
        try:
            self._front.start(self._address, self._upstream, reuse_port=self._reuse_port)
        except RecserveError:
            self._inner.stop(0)
            raise

    def stop(self, grace: float) -> threading.Event:
        """Refuse new calls at once; an event set when the calls in flight ended (or the
        grace ran out): the front first (it forwards to grpcio), then grpcio."""
        done = threading.Event()

        def stop_both() -> None:
            self._front.push_health()  # draining: open watches end now, not at the grace's end
            self._front.shutdown(grace)
            self._inner.stop(0).wait()
            done.set()

        threading.Thread(target=stop_both, name="recserve-grpc-stop", daemon=True).start()
        return done


def build_grpc_front_door(ctx: ServerContext, host: str, port: int, *, workers: int,
                          reuse_port: bool = False) -> grpc.Server | FrontedGrpcServer:
    """The gRPC server of the public port, to start: the C++ front end before grpcio when
    available, else grpcio alone (RuntimeError here, or RecserveError from start(), when the
    port is taken)."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if not available():
        return build_grpc_server(ctx, address, workers=workers, reuse_port=reuse_port)
    # An abstract Unix socket: nothing on disk to clean up, private to this process's use.
    upstream = f"unix-abstract:recserve-grpc-{os.getpid()}-{secrets.token_hex(6)}"
    inner = build_grpc_server(ctx, upstream, workers=workers)
    front = GrpcFront(ctx, max_in_flight=call_limit(ctx, workers))
    return FrontedGrpcServer(front, inner, upstream, address, reuse_port)
