"""The least a Python gRPC servicer that runs the model in grpcio's handler can cost:
grpcio's sync server (as recserve's: its worker count, a call limit) whose
`/tensorflow.eas.PredictionService/Predict` hands the request's bytes to `Processor.process`
and sets the trailing metadata recserve sends (the answering version), and nothing else: no
model lookup, lease, metrics, deadline check or warmup recording.

    python -m benchmarks.peers.grpc_processor PORT WORKERS CONFIG_JSON
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import grpc

from recserve import Processor
from recserve.processor.trace import RequestTrace


def main(port: int, workers: int, config: Path) -> None:
    processor = Processor(json.loads(config.read_text()))

    def predict(request: bytes, context: grpc.ServicerContext) -> bytes:
        trace = RequestTrace()
        status, result = processor.process(request, trace=trace)
        if status != 200:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, bytes(result).decode("utf-8", "replace"))
        context.set_trailing_metadata(trace.served_by())
        return bytes(result)

    handler = grpc.method_handlers_generic_handler(
        "tensorflow.eas.PredictionService",
        {"Predict": grpc.unary_unary_rpc_method_handler(predict)},  # raw bytes both ways
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), maximum_concurrent_rpcs=workers + 64)
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop(1).wait()
    processor.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
