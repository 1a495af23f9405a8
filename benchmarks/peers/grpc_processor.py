"""The least a Python gRPC servicer that runs the model in grpcio's handler can cost:
grpcio's sync server (as recserve's: its worker count, a call limit) whose
`/tensorflow.eas.PredictionService/Predict` hands the request's bytes to `Processor.process`
and sets the trailing metadata recserve sends (the answering version), and nothing else: no
model lookup, lease, metrics, deadline check or warmup recording.

    python -m benchmarks.peers.grpc_processor PORT WORKERS CONFIG_JSON
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import grpc

from benchmarks.peers.grpc_fixed import serve_predict
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

    try:
        serve_predict(port, workers, predict, maximum_concurrent_rpcs=workers + 64)
    finally:
        processor.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]))
