"""String tensors the graph itself reads: what a request sends is what the graph sees.
(A bytes element used to reach ONNX Runtime as the text "b'abc'".) The reference is a
direct onnxruntime run fed Python text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from recserve import Processor
from recserve.errors import RequestError
from recserve.wire.codec import decode_response, encode_request


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """out = s as it is; hit = (s == "héllo"): the graph compares text."""
    directory = tmp_path_factory.mktemp("strings")
    target = helper.make_tensor("target", TensorProto.STRING, [], ["héllo".encode()])
    graph = helper.make_graph(
        [helper.make_node("Identity", ["s"], ["out"]),
         helper.make_node("Constant", [], ["t"], value=target),
         helper.make_node("Equal", ["s", "t"], ["hit"])],
        "strings",
        [helper.make_tensor_value_info("s", TensorProto.STRING, ["n"])],
        [helper.make_tensor_value_info("out", TensorProto.STRING, ["n"]),
         helper.make_tensor_value_info("hit", TensorProto.BOOL, ["n"])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9),
              directory / "model.onnx")
    return directory


@pytest.fixture(scope="module")
def processor(model_dir: Path) -> Processor:
    p = Processor({"savedmodel_dir": str(model_dir)})
    yield p
    p.close()


def test_the_graph_reads_the_bytes_sent(model_dir: Path, processor: Processor) -> None:
    sent = [b"abc", "héllo".encode(), b"", "日本".encode()]
    direct = ort.InferenceSession(str(model_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    want_out, want_hit = direct.run(["out", "hit"], {"s": np.array([v.decode() for v in sent], dtype=object)})
    assert want_hit.tolist() == [False, True, False, False]
    status, body = processor.process(encode_request({"s": np.array(sent, dtype=object)}))
    assert status == 200, body
    got = decode_response(body)
    assert got["out"].tolist() == sent == [v.encode() for v in want_out.tolist()]
    assert got["hit"].tolist() == want_hit.tolist()
    answer = processor.predict({"s": np.array(sent, dtype=object)})
    assert answer["out"].tolist() == want_out.tolist() and answer["hit"].tolist() == want_hit.tolist()


def test_bytes_that_are_not_utf8_are_refused_by_name(processor: Processor) -> None:
    status, body = processor.process(encode_request({"s": np.array([b"ok", b"\xff\xfe"], dtype=object)}))
    assert status == 400, body
    assert body.decode() == (
        "string input 's': element 1 (b'\\xff\\xfe') is not valid UTF-8 at byte 0; this model's string "
        "inputs run on ONNX Runtime's Python binding, which holds strings as UTF-8 text")
    with pytest.raises(RequestError, match="element 1"):
        processor.predict({"s": np.array([b"ok", b"\xff"], dtype=object)})
