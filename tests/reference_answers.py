"""Processors checked against the numpy + onnxruntime reference (recserve/export/reference.py),
never against another Processor: a bug shared by two of recserve's load paths would agree
with itself."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recserve import Processor
from recserve.export.reference import Reference

# The reference runs the graph with the rows as initializers, the Processor feeds them as
# inputs: the same ONNX Runtime kernels, a float32 rounding apart at most.
ATOL = 1e-6


def assert_answers_like_reference(
    processors: Sequence[Processor], reference: Reference, inputs: Mapping[str, Any]
) -> dict[str, np.ndarray]:
    """Each processor's answer to `inputs` equals the reference's (within ATOL); returns it."""
    want = reference.predict(inputs)
    for index, processor in enumerate(processors):
        got = processor.predict(inputs)
        assert set(got) == set(want), (index, sorted(got), sorted(want))
        for name in want:
            np.testing.assert_allclose(got[name], want[name], atol=ATOL, rtol=0,
                                       err_msg=f"processor {index}, output {name!r}")
    return want
