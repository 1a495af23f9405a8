"""ONNX Runtime sessions, execution providers and graph rewrites.

ONNX Runtime comes from an extra (`recserve[cpu]` or `recserve[gpu]`), so that the GPU build
never sits beside a CPU build pulled back in by a plain dependency; without either, the
first import of this layer says which to install instead of a bare ModuleNotFoundError.
"""

try:
    import onnxruntime  # noqa: F401
except ModuleNotFoundError as exc:  # pragma: no cover - exercised in a subprocess by the tests
    if exc.name != "onnxruntime":
        raise
    raise ModuleNotFoundError(
        "recserve needs ONNX Runtime, which is not installed: pip install 'recserve[cpu]' "
        "(or 'recserve[gpu]' for onnxruntime-gpu)", name="onnxruntime") from exc
