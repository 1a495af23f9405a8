"""Feeds for a placed model's dense graph: ids computed on the CPU, rows looked up,
request inputs passed through (the request side of `recserve.runtime.placement`).

`lookup(table, ids)` is the embedding engine's (`EmbeddingTable.lookup(ids, "none")`
in the servable, `numpy.take` in tests): ids of any shape give rows of shape
ids.shape + [dim]. The ids graph runs in its own one-thread ONNX Runtime session on the
calling thread. Thread-safe: `dense_feeds` may be called from many threads.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnxruntime as ort

from recserve.errors import RequestError
from recserve.runtime.placement import PlacedModel

__all__ = ["Lookup", "PlacedInputs"]

Lookup = Callable[[str, np.ndarray], np.ndarray]


class PlacedInputs:
    def __init__(self, placed: PlacedModel) -> None:
        self.placed = placed
        self._ids_session: ort.InferenceSession | None = None
        if placed.ids_model_path is not None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 1
            options.inter_op_num_threads = 1
            options.log_severity_level = 3
            self._ids_session = ort.InferenceSession(
                placed.ids_model_path, options, providers=["CPUExecutionProvider"]
            )
            self._ids_outputs = [o.name for o in self._ids_session.get_outputs()]

    def ids(self, request: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every looked-up id tensor, as int64, by name."""
        found: dict[str, np.ndarray] = {}
        if self._ids_session is not None:
            feeds = {name: request[name] for name in self.placed.ids_inputs}
            try:
                values = self._ids_session.run(self._ids_outputs, feeds)
            except ort.capi.onnxruntime_pybind11_state.InvalidArgument as exc:
                raise RequestError(f"the model rejected the inputs: {exc}") from exc
            found.update(zip(self._ids_outputs, values))
        for lookup in self.placed.lookups:
            if lookup.ids not in found:
                found[lookup.ids] = request[lookup.ids]
        return {name: np.asarray(value, dtype=np.int64) for name, value in found.items()}

    def dense_feeds(self, request: Mapping[str, np.ndarray], lookup: Lookup) -> dict[str, np.ndarray]:
        """The dense graph's feeds for one request (keyed by the original input names)."""
        ids = self.ids(request)
        feeds = {name: request[name] for name in self.placed.dense_request_inputs}
        for item in self.placed.lookups:
            feeds[item.graph_input] = lookup(item.table, ids[item.ids])
        return feeds
