from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from benchmarks.models import PlainDlrmModel, build_plain_dlrm
from recserve import Processor
from recserve.export import write_checkpoint, write_model_dir
from recserve.export.demo import DemoModel, write_demo
from recserve.model_spec import EmbeddingBinding, ModelSpec


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return write_demo(tmp_path_factory.mktemp("demo") / "demo")


@pytest.fixture(scope="module")
def processor(demo: DemoModel) -> Iterator[Processor]:
    p = Processor(demo.config_path.read_text())
    yield p
    p.close()


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> PlainDlrmModel:
    """The DLRM-like plain ONNX model the benchmarks serve (26 tables under placement)."""
    return build_plain_dlrm(tmp_path_factory.mktemp("plain"), rows=2000)


@pytest.fixture(scope="module")
def plain_processor(plain: PlainDlrmModel) -> Iterator[Processor]:
    p = Processor(plain.config())
    yield p
    p.close()


@pytest.fixture
def request_inputs(demo: DemoModel) -> dict[str, np.ndarray]:
    return demo.sample_inputs(3, np.random.default_rng(0))


@pytest.fixture
def one_big_table(tmp_path: Path) -> Callable[[int, int], tuple[Path, Path]]:
    """Writes a model reading one table "big" (input "id") and its version 1 with `rows` random
    rows of `dim` floats; returns (model dir, checkpoint dir). For memory tests."""

    def write(rows: int, dim: int) -> tuple[Path, Path]:
        graph = helper.make_graph(
            [helper.make_node("ReduceSum", ["emb"], ["score"], keepdims=0)], "g",
            [helper.make_tensor_value_info("emb", TensorProto.FLOAT, ["B", dim])],
            [helper.make_tensor_value_info("score", TensorProto.FLOAT, ["B"])],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
        spec = ModelSpec(embeddings=(EmbeddingBinding(input="id", table="big", dim=dim, graph_input="emb"),))
        model_dir = write_model_dir(tmp_path / "model", model, spec)
        values = np.random.default_rng(3).standard_normal((rows, dim), dtype=np.float32)
        write_checkpoint(tmp_path / "ckpt", {"big": (np.arange(rows, dtype=np.int64), values)}, global_step=1)
        return Path(model_dir), tmp_path / "ckpt"

    return write
