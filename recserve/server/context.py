"""What every protocol layer shares: the models, the dispatcher, metrics and settings."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from recserve.processor.processor import Processor
from recserve.server.dispatch import Dispatcher
from recserve.server.errors import UnknownModelError
from recserve.server.inline_policy import InlinePolicy
from recserve.server.merging import RequestMerger
from recserve.server.metrics import ServerMetrics
from recserve.server.registry import ModelEntry, ModelRegistry
from recserve.server.settings import ServerSettings

__all__ = ["ServerContext", "check_version"]


@dataclass(frozen=True)
class ServerContext:
    """Immutable; its parts are thread-safe."""

    models: ModelRegistry
    dispatcher: Dispatcher
    metrics: ServerMetrics
    settings: ServerSettings
    workers: ThreadPoolExecutor  # HTTP predictions `inline` does not keep on the event loop run here
    inline: InlinePolicy
    merger: RequestMerger  # EAS predictions of models that merge requests (event loop only)


def check_version(entry: ModelEntry, processor: Processor, version: str | None) -> None:
    """A request that names a version is served only by that version."""
    if not version:
        return
    serving = processor.model_info().get("version")
    if str(serving) != version:
        raise UnknownModelError(
            f"model {entry.name!r} serves version {serving!r}; version {version!r} is not loaded")
