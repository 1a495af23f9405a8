"""The floor of a Python gRPC server: grpcio's sync server (as recserve's, same thread count)
answering `/tensorflow.eas.PredictionService/Predict` with fixed bytes, whatever it is sent.

    python -m benchmarks.peers.grpc_fixed PORT WORKERS RESPONSE_FILE
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from concurrent import futures
from pathlib import Path

import grpc

Predict = Callable[[bytes, grpc.ServicerContext], bytes]


def serve_predict(port: int, workers: int, predict: Predict, maximum_concurrent_rpcs: int | None = None) -> None:
    """Serve `predict` as EAS Predict (raw bytes both ways) on a grpcio sync server of
    `workers` threads until SIGTERM; prints "ready" once listening."""
    handler = grpc.method_handlers_generic_handler(
        "tensorflow.eas.PredictionService", {"Predict": grpc.unary_unary_rpc_method_handler(predict)})
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                         maximum_concurrent_rpcs=maximum_concurrent_rpcs)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop(1).wait()


def main(port: int, workers: int, response: bytes) -> None:
    serve_predict(port, workers, lambda request, context: response)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]).read_bytes())
