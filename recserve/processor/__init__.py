"""The Processor and what serves one model version."""

# First: without ONNX Runtime this names the extra to install (recserve.runtime).
import recserve.runtime  # noqa: F401
