"""CUDA streams created by recserve, one per session when `use_multi_stream` is true.

A stream is handed to ONNX Runtime as the session's `user_compute_stream`, so all of
that session's GPU work is queued on it and sessions on one GPU overlap instead of
sharing a queue. The streams come from the CUDA runtime (libcudart, which onnxruntime-gpu
loads anyway) through ctypes. Written to the CUDA runtime API and not run: no GPU was
available where this was written. Not thread-safe: one owner (a SessionGroup) creates
and destroys its streams.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys

from recserve.errors import ModelLoadError

__all__ = ["CudaStreams"]

_NON_BLOCKING = 0x1  # cudaStreamNonBlocking: no implicit sync with the legacy default stream


def _load_cudart() -> ctypes.CDLL:
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    # The nvidia-cuda-runtime wheels that onnxruntime-gpu depends on keep it in site-packages.
    for base in sys.path:
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cu*", "lib", "libcudart.so*")))
        names += sorted(glob.glob(os.path.join(base, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    errors = []
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise ModelLoadError(
        "use_multi_stream needs the CUDA runtime library (libcudart) to create streams and it "
        f"was not found: {errors[0] if errors else 'no candidates'}"
    )


class CudaStreams:
    def __init__(self) -> None:
        self._cudart: ctypes.CDLL | None = None
        self._streams: list[tuple[int, ctypes.c_void_p]] = []

    def _call(self, what: str, status: int) -> None:
        if status != 0:
            assert self._cudart is not None
            self._cudart.cudaGetErrorString.restype = ctypes.c_char_p
            text = self._cudart.cudaGetErrorString(status).decode()
            raise ModelLoadError(f"CUDA {what} failed with error {status}: {text}")

    def create(self, device_id: int) -> int:
        """A new non-blocking stream on `device_id`; its pointer as an int."""
        if self._cudart is None:
            self._cudart = _load_cudart()
        stream = ctypes.c_void_p()
        self._call(f"cudaSetDevice({device_id})", self._cudart.cudaSetDevice(device_id))
        self._call(
            "cudaStreamCreateWithFlags",
            self._cudart.cudaStreamCreateWithFlags(ctypes.byref(stream), _NON_BLOCKING),
        )
        self._streams.append((device_id, stream))
        return int(stream.value or 0)

    def close(self) -> None:
        """Destroy the streams; only after every session using them is gone."""
        if self._cudart is None:
            return
        for device_id, stream in self._streams:
            self._cudart.cudaSetDevice(device_id)
            self._cudart.cudaStreamDestroy(stream)
        self._streams.clear()
