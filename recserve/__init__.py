"""recserve: production serving for recommendation models on ONNX Runtime."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from recserve import errors

if TYPE_CHECKING:
    from recserve.processor.processor import Processor

__all__ = ["Processor", "__version__", "errors"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # Importing `recserve.errors` or `recserve.export` must not pull in onnxruntime.
    if name == "Processor":
        from recserve.processor.processor import Processor

        return Processor
    raise AttributeError(f"module 'recserve' has no attribute {name!r}")
