"""Dense initializers held once per group and handed to every session.

`SessionOptions.add_initializer` makes a session use a caller's buffer instead of its own
copy, so N sessions cost one copy of the weights (the buffers must outlive the sessions;
this object keeps them). Prepacking must be off for that to hold: MatMul/Gemm would
otherwise repack each weight into a private buffer per session (BENCHMARKS.md has both).
Initializers under `MIN_SHARED_BYTES` (shapes, small biases) stay in the graph, where the
optimizer may fold them. Immutable after construction; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
import onnxruntime as ort
from onnx import numpy_helper

from recserve.errors import ModelLoadError

__all__ = ["MIN_SHARED_BYTES", "SharedInitializers"]

MIN_SHARED_BYTES = 64 * 1024


class SharedInitializers:
    def __init__(self, model_path: str, overrides: Mapping[str, np.ndarray] | None = None, *,
                 partial: bool = False) -> None:
        """partial: `overrides` may hold more than the graph's initializers (a TensorFlow
        checkpoint holds every variable): only the initializers' are read, the rest ignored."""
        try:
            model = onnx.load(model_path)
        except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
            raise ModelLoadError(f"cannot read ONNX model {model_path}: {exc}") from exc
        by_name = {t.name: t for t in model.graph.initializer}
        source = overrides or {}
        given = {n: source[n] for n in by_name if n in source} if partial else dict(source)
        # The values that replaced initializers: what another process needs to build the same.
        self.overridden: dict[str, np.ndarray] = given
        unknown = sorted(set(given) - set(by_name))
        if unknown:
            raise ModelLoadError(
                f"dense.safetensors has tensors {unknown} that are not initializers of {model_path}"
            )
        self._arrays: dict[str, np.ndarray] = {}
        for name, tensor in by_name.items():
            if name in given:
                value = np.ascontiguousarray(given[name])
                expected = tuple(tensor.dims)
                if value.shape != expected:
                    raise ModelLoadError(
                        f"dense.safetensors tensor {name!r} has shape {list(value.shape)}, the graph's "
                        f"initializer has {list(expected)}"
                    )
            elif tensor.data_type != onnx.TensorProto.STRING and _nbytes(tensor) >= MIN_SHARED_BYTES:
                value = numpy_helper.to_array(tensor)
            else:
                continue
            self._arrays[name] = value
        del model
        self._values: dict[str, ort.OrtValue] | None = None  # the Python binding's views, made on first use

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The shared buffers by initializer name (the C API runner wraps these same buffers)."""
        return dict(self._arrays)

    @property
    def names(self) -> list[str]:
        return sorted(self._arrays)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())

    def add_to(self, options: ort.SessionOptions) -> None:
        if self._values is None:
            self._values = {name: ort.OrtValue.ortvalue_from_numpy(a) for name, a in self._arrays.items()}
        for name, value in self._values.items():
            options.add_initializer(name, value)


def _nbytes(tensor: onnx.TensorProto) -> int:
    count = int(np.prod(tensor.dims, dtype=np.int64)) if tensor.dims else 1
    return count * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
