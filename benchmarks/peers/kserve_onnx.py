"""KServe's own Python model server hosting an ONNX file with onnxruntime (1 intra-op and 1
inter-op thread), the way a KServe user serves a custom model: the peer recserve's KServe v2
route is compared with (bench_kserve). Runs in its own virtualenv (`make peers` builds
.venv-peers with kserve and onnxruntime from PyPI): kserve pins its own fastapi, uvicorn and
protobuf.

    .venv-peers/bin/python benchmarks/peers/kserve_onnx.py MODEL.onnx NAME HTTP_PORT GRPC_PORT \
        --configure_logging false
"""

from __future__ import annotations

import sys

import kserve
import onnxruntime as ort
from kserve import InferOutput, InferRequest, InferResponse

_DATATYPES = {"tensor(float)": "FP32", "tensor(int64)": "INT64", "tensor(int32)": "INT32", "tensor(double)": "FP64"}


class OnnxModel(kserve.Model):
    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        self.outputs = [(o.name, _DATATYPES[o.type]) for o in self.session.get_outputs()]
        self.ready = True

    def predict(self, payload: InferRequest, headers: dict[str, str] | None = None,
                response_headers: dict[str, str] | None = None) -> InferResponse:
        feeds = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
        values = self.session.run([name for name, _ in self.outputs], feeds)
        outputs = [InferOutput(name=name, shape=list(value.shape), datatype=datatype, data=value)
                   for (name, datatype), value in zip(self.outputs, values)]
        return InferResponse(response_id=payload.id or "", model_name=self.name, infer_outputs=outputs)


if __name__ == "__main__":
    # kserve reads its own flags from sys.argv as well: the benchmark passes
    # `--configure_logging false`, so no access log or latency trace line is written per
    # request (recserve writes none either).
    path, name, http_port, grpc_port = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    kserve.ModelServer(http_port=http_port, grpc_port=grpc_port, enable_grpc=False, enable_latency_logging=False,
                       workers=1).start([OnnxModel(name, path)])
