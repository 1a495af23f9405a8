from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from recserve import Processor
from recserve.export.demo import DemoModel, write_demo


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoModel:
    return write_demo(tmp_path_factory.mktemp("demo") / "demo")


@pytest.fixture(scope="module")
def processor(demo: DemoModel) -> Iterator[Processor]:
    p = Processor(demo.config_path.read_text())
    yield p
    p.close()


@pytest.fixture
def request_inputs(demo: DemoModel) -> dict[str, np.ndarray]:
    return demo.sample_inputs(3, np.random.default_rng(0))
