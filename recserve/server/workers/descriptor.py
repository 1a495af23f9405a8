"""What a worker needs to serve the leader's version: names, paths and table handles.

The leader built the version's tables in the shared arena; a worker attaches them by handle
(no copy of a row; tables in Redis: the worker reads Redis as any replica does, its cache
its own) and builds only what is its own: ONNX Runtime sessions, from the same
model directory and the version's dense parameters, then runs the warmup on them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from recserve.config import ProcessorConfig
from recserve.embedding import EmbeddingTable
from recserve.model_spec import DefaultSpec
from recserve.model_store.checkpoint import Checkpoint
from recserve.model_store.manifest import Manifest
from recserve.model_store.model_dir import load_model_dir
from recserve.model_store.storage import LocalStorage
from recserve.model_store.versions import VersionRef
from recserve.processor.processor import Processor
from recserve.processor.servable import Servable
from recserve.runtime.placement import PlacedModel

__all__ = ["ServableDescriptor", "SharedTable"]


@dataclass(frozen=True)
class SharedTable:
    name: str
    dim: int
    default: DefaultSpec
    handle: int


@dataclass(frozen=True)
class ServableDescriptor:
    model: str
    version: str
    global_step: int
    model_dir: str
    placed: PlacedModel | None  # its tables' rows left out: the shared tables hold them
    dense: Mapping[str, np.ndarray]
    tables: tuple[SharedTable, ...]

    @classmethod
    def of(cls, processor: Processor, servable: Servable) -> ServableDescriptor:
        placed = processor.placed
        if placed is not None:
            placed = dataclasses.replace(placed, tables={
                name: np.empty((0, rows.shape[1]), np.float32) for name, rows in placed.tables.items()})
        return cls(
            model=processor.model_name,
            version=servable.version,
            global_step=servable.global_step,
            model_dir=processor.model_dir,
            placed=placed,
            dense=dict(servable.dense_overrides),
            # Tables in Redis are not shared memory: each worker serves them as a replica does.
            tables=() if servable.redis is not None else tuple(
                SharedTable(name, t.dim, t.default, t.handle) for name, t in servable.tables.items()),
        )

    def build(self, config: ProcessorConfig) -> Servable:
        """This process's servable of the version, over the leader's tables."""
        tables = None if config.uses_redis else {
            t.name: EmbeddingTable.attach(t.name, t.dim, t.default, t.handle) for t in self.tables}
        checkpoint = Checkpoint(VersionRef(self.version, "", self.global_step),
                                Manifest("full", self.global_step, {}), {}, dict(self.dense))
        model = load_model_dir(LocalStorage(), self.model_dir)
        return Servable.load(model, checkpoint, config, placed=self.placed, model_name=self.model,
                             tables=tables)
