"""Execution providers for a session: which ones, with which options, and the check that
ONNX Runtime really used them.

Asked for `CUDAExecutionProvider` on a machine or build without it, ONNX Runtime logs an
error and silently runs on the CPU; `check_providers` turns that into a load failure that
says why, unless the config allows the fallback. TensorRT needs an optimization profile
per input: the batch dimension goes from 1 to `max_batch_size`, every other dimension
must be fixed by the graph. No GPU was available where this was written: the option
dictionaries are unit-tested, running them on a GPU is not (docs/sessions.md).
Pure functions; thread-safe.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import onnxruntime as ort

from recserve.errors import ConfigError, ModelLoadError

__all__ = [
    "CPU",
    "CUDA",
    "TENSORRT",
    "DeviceSettings",
    "ProviderList",
    "check_providers",
    "provider_list",
    "tensorrt_profiles",
]

log = logging.getLogger("recserve.runtime")

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"

ProviderList = list[tuple[str, dict[str, str]]]
InputShape = tuple[str, tuple[int | None, ...]]


@dataclass(frozen=True, kw_only=True)
class DeviceSettings:
    """Where one session runs; immutable. `stream` is a CUDA stream pointer or None for
    ONNX Runtime's own streams."""

    provider: Literal["cpu", "cuda", "tensorrt"] = "cpu"
    device_id: int = 0
    stream: int | None = None
    trt_fp16: bool = False
    trt_engine_cache_path: str = ""
    max_batch_size: int = 0


def tensorrt_profiles(inputs: Sequence[InputShape], max_batch_size: int) -> dict[str, str]:
    """`trt_profile_{min,opt,max}_shapes`: batch 1 / max / max, other dimensions as the graph fixes them."""
    if max_batch_size < 1:
        raise ConfigError(
            "the TensorRT provider builds its engine for a batch range; set max_batch_size >= 1 "
            "(the largest batch it will be built for)",
            field="max_batch_size",
        )
    shapes: dict[str, list[str]] = {"min": [], "opt": [], "max": []}
    for name, shape in inputs:
        rest = shape[1:]
        if not shape or any(d is None for d in rest):
            raise ConfigError(
                f"the TensorRT provider needs every dimension but the first (batch) fixed; graph input "
                f"{name!r} has shape {['?' if d is None else d for d in shape]}",
                field="execution_provider",
            )
        dims = "x".join(str(d) for d in rest)
        for key, batch in (("min", 1), ("opt", max_batch_size), ("max", max_batch_size)):
            shapes[key].append(f"{name}:{batch}" + (f"x{dims}" if dims else ""))
    return {f"trt_profile_{key}_shapes": ",".join(value) for key, value in shapes.items()}


def _cuda_options(device: DeviceSettings) -> dict[str, str]:
    options = {"device_id": str(device.device_id)}
    if device.stream is not None:
        options["has_user_compute_stream"] = "1"
        options["user_compute_stream"] = str(device.stream)
    return options


def provider_list(device: DeviceSettings, inputs: Sequence[InputShape] = ()) -> ProviderList:
    """Providers in priority order with their options, CPU last (for the nodes the device
    provider does not take)."""
    if device.provider == "cpu":
        return [(CPU, {})]
    cuda = _cuda_options(device)
    if device.provider == "cuda":
        return [(CUDA, cuda), (CPU, {})]
    trt = dict(cuda)
    trt["trt_fp16_enable"] = "1" if device.trt_fp16 else "0"
    if device.trt_engine_cache_path:
        trt["trt_engine_cache_enable"] = "1"
        trt["trt_engine_cache_path"] = device.trt_engine_cache_path
    trt.update(tensorrt_profiles(inputs, device.max_batch_size))
    return [(TENSORRT, trt), (CUDA, cuda), (CPU, {})]


def check_providers(session: Any, wanted: ProviderList, *, allow_cpu_fallback: bool, where: str) -> None:
    """ModelLoadError unless `session` got the first provider asked for; with
    `allow_cpu_fallback`, a warning instead."""
    first = wanted[0][0]
    got = list(session.get_providers())
    if first in got:
        return
    available = ort.get_available_providers()
    if first not in available:
        reason = (
            f"this onnxruntime build ({ort.__version__}) has no {first}; its providers are {available} "
            "(install onnxruntime-gpu for CUDA and TensorRT)"
        )
    else:
        reason = (
            f"{first} is in this onnxruntime build but did not start: no GPU visible to this process, "
            "a driver older than the CUDA runtime, or missing CUDA/cuDNN/TensorRT libraries "
            "(onnxruntime's log above has the detail)"
        )
    message = f"{where}: asked for {first}, onnxruntime created the session with {got}: {reason}"
    if not allow_cpu_fallback:
        raise ModelLoadError(message + "; set allow_cpu_fallback to true to serve on the CPU instead")
    log.warning("%s; serving on %s because allow_cpu_fallback is true", message, got)
