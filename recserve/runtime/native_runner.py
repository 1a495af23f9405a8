"""A session group run through ONNX Runtime's C API (native/ort_runner.c), with the GIL
released for the whole run.

The C runner dlopens the onnxruntime wheel's own libonnxruntime.so (RTLD_LOCAL; a copy
separate from the Python binding's), so its sessions are not `ort.InferenceSession`s:
they are built here from the same inputs a Python session gets (`SessionOptionValues`,
the provider list, the shared initializers' buffers, a CPU group) and run through
ctypes, which drops the GIL during every foreign call. `handle` and `dense_run_address`
let native code (the request route) call the runner directly through the seam in
native/dense_run.h without entering Python at all.

Thread-safety: `run`/`run_on` from any number of threads; `add_session` before the first
run; `close` once, after the last run. The initializer arrays given to the constructor
must stay alive until `close` (the runner keeps references to them).
"""

from __future__ import annotations

import array as array_module
import ctypes
import glob
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from recserve.errors import InternalError, ModelLoadError, RequestError
from recserve.native_library import open_library
from recserve.runtime.providers import ProviderList
from recserve.runtime.session_options import SessionOptionValues

__all__ = ["NativeRunner", "OrtTensorInfo", "native_dtype", "onnxruntime_library", "use_env"]

log = logging.getLogger("recserve.runtime")

POLICIES = {"MOD": 0, "RR": 1, "LEAST_BUSY": 2}
_MAX_RANK = 8
_ELEM_TYPES: dict[np.dtype[Any], int] = {
    np.dtype(np.float32): 1, np.dtype(np.uint8): 2, np.dtype(np.int8): 3, np.dtype(np.uint16): 4,
    np.dtype(np.int16): 5, np.dtype(np.int32): 6, np.dtype(np.int64): 7, np.dtype(np.bool_): 9,
    np.dtype(np.float16): 10, np.dtype(np.float64): 11, np.dtype(np.uint32): 12, np.dtype(np.uint64): 13,
}
_DTYPES = {code: dtype for dtype, code in _ELEM_TYPES.items()}
# ONNX Runtime's names for TensorProto element types, as `NodeArg.type` spells them.
_TYPE_NAMES = {
    1: "float", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 8: "string",
    9: "bool", 10: "float16", 11: "double", 12: "uint32", 13: "uint64", 14: "complex64",
    15: "complex128", 16: "bfloat16",
}

_i64p = ctypes.POINTER(ctypes.c_int64)
_err = ctypes.POINTER(ctypes.c_char_p)


class _TensorIn(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("elem_type", ctypes.c_int32),
        ("shape", _i64p),
        ("rank", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
    ]


class _TensorOut(ctypes.Structure):
    _fields_ = [
        ("elem_type", ctypes.c_int32),
        ("shape", ctypes.c_int64 * _MAX_RANK),
        ("rank", ctypes.c_size_t),
        ("data", ctypes.c_void_p),
        ("bytes", ctypes.c_size_t),
    ]


class _Initializer(ctypes.Structure):
    """rs_ort_initializer: an rs_tensor_in and its size in bytes."""

    _fields_ = [*_TensorIn._fields_, ("bytes", ctypes.c_size_t)]


class _SessionSpec(ctypes.Structure):
    _fields_ = [
        ("intra_op_threads", ctypes.c_int),
        ("inter_op_threads", ctypes.c_int),
        ("parallel_execution", ctypes.c_int),
        ("per_session_threads", ctypes.c_int),
        ("log_severity", ctypes.c_int),
        ("graph_optimization_level", ctypes.c_int),
        ("n_config", ctypes.c_size_t),
        ("config_keys", ctypes.POINTER(ctypes.c_char_p)),
        ("config_values", ctypes.POINTER(ctypes.c_char_p)),
        ("n_providers", ctypes.c_size_t),
        ("provider_names", ctypes.POINTER(ctypes.c_char_p)),
        ("provider_option_counts", ctypes.POINTER(ctypes.c_size_t)),
        ("provider_keys", ctypes.POINTER(ctypes.c_char_p)),
        ("provider_values", ctypes.POINTER(ctypes.c_char_p)),
        ("cpus", ctypes.POINTER(ctypes.c_int)),
        ("n_cpus", ctypes.c_size_t),
    ]


_TensorInP = ctypes.POINTER(_TensorIn)
_TensorOutP = ctypes.POINTER(_TensorOut)
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rs_ort_env": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, _err]),
    "rs_ort_version": (ctypes.c_char_p, []),
    "rs_ort_api_version": (ctypes.c_uint, []),
    "rs_ort_available_providers": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t, _err]),
    "rs_ort_runner_new": (ctypes.c_void_p, [ctypes.c_int, ctypes.POINTER(_Initializer), ctypes.c_size_t, _err]),
    "rs_ort_runner_add_session": (
        ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(_SessionSpec), _err]
    ),
    "rs_ort_runner_session_count": (ctypes.c_size_t, [ctypes.c_void_p]),
    "rs_ort_session_providers": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t],
    ),
    "rs_ort_runner_io_count": (ctypes.c_size_t, [ctypes.c_void_p, ctypes.c_int]),
    "rs_ort_runner_io": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
         ctypes.POINTER(ctypes.c_int32), _i64p, ctypes.POINTER(ctypes.c_size_t), _err],
    ),
    "rs_ort_dense_run": (
        ctypes.c_int,
        [ctypes.c_void_p, _TensorInP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
         _TensorOutP, _err],
    ),
    "rs_ort_run_session": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_size_t, _TensorInP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p),
         ctypes.c_size_t, _TensorOutP, _err],
    ),
    # Python's hot path: the outputs and error slot go as addresses (ints convert to c_void_p
    # several times faster than ctypes arrays convert to typed pointers).
    "rs_ort_run_any": (
        ctypes.c_int,
        [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_char_p),
         ctypes.c_size_t, ctypes.c_void_p, ctypes.c_void_p],
    ),
    "rs_ort_free_outputs": (None, [ctypes.c_void_p, ctypes.c_size_t]),
    "rs_ort_pick_session": (ctypes.c_size_t, [ctypes.c_void_p]),
    "rs_ort_session_in_flight": (ctypes.c_long, [ctypes.c_void_p, ctypes.c_size_t]),
    "rs_ort_free_error": (None, [ctypes.c_void_p]),
    "rs_ort_runner_free": (None, [ctypes.c_void_p]),
}


_lib = open_library(Path(__file__).with_name("librecserve_ort.so"), "ONNX Runtime runner", _SIGNATURES, twin=False)
_env_lock = threading.Lock()


def _take_error(err: ctypes.c_char_p) -> str:
    """The C side's malloc'd message, freed here."""
    if not err.value:
        return "no message"
    text = err.value.decode("utf-8", "replace")
    _lib.rs_ort_free_error(ctypes.cast(err, ctypes.c_void_p))
    return text


def onnxruntime_library() -> str:
    """The installed onnxruntime wheel's C library (onnxruntime/capi/libonnxruntime.so.*)."""
    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    found = sorted(glob.glob(os.path.join(capi, "libonnxruntime.so*")))
    if not found:
        raise ModelLoadError(
            f"the onnxruntime package at {os.path.dirname(ort.__file__)} has no libonnxruntime.so in capi/; "
            "recserve's native runner needs the wheel's C library (set RECSERVE_NATIVE_DENSE=0 to use "
            "the Python sessions)"
        )
    return found[-1]


def use_env(global_pools: tuple[int, int, bool] | None = None) -> str:
    """Load ONNX Runtime's C library and create this process's env (once); its version.
    `global_pools` (intra, inter, spinning): the env's global pools, for sessions with
    per_session_threads false."""
    with _env_lock:
        err = ctypes.c_char_p()
        intra, inter, spinning = global_pools or (0, 0, False)
        status = _lib.rs_ort_env(
            onnxruntime_library().encode(), int(global_pools is not None), intra, inter, int(spinning),
            ctypes.byref(err),
        )
        if status:
            raise ModelLoadError(_take_error(err))
        return str(_lib.rs_ort_version().decode())


def api_version() -> int:
    """The OrtApi version native/ort_api.h declares and requests from ONNX Runtime."""
    return int(_lib.rs_ort_api_version())


def available_providers() -> list[str]:
    """The providers the C library reports (GetAvailableProviders)."""
    buf = ctypes.create_string_buffer(4096)
    err = ctypes.c_char_p()
    if _lib.rs_ort_available_providers(buf, len(buf), ctypes.byref(err)):
        raise InternalError(_take_error(err))
    return buf.value.decode().split(",") if buf.value else []


def native_dtype(dtype: np.dtype[Any]) -> bool:
    """Whether the native runner can feed and return tensors of `dtype`."""
    return np.dtype(dtype) in _ELEM_TYPES


@dataclass(frozen=True)
class OrtTensorInfo:
    """A graph input or output as the C API reports it, shaped like the Python binding's
    NodeArg (name, type "tensor(float)", shape with None for a free dim)."""

    name: str
    type: str
    shape: list[int | None]


class _Scratch:
    """One thread's rs_tensor_out array, its int64 view and an error slot."""

    def __init__(self, size: int) -> None:
        self.outs = (_TensorOut * size)()
        self.words = np.frombuffer(self.outs, np.int64).reshape(size, ctypes.sizeof(_TensorOut) // 8)
        self.outs_at = ctypes.addressof(self.outs)
        self.err = ctypes.c_char_p()
        self.err_at = ctypes.addressof(self.err)


_Byte = ctypes.c_char


def _address(array: np.ndarray) -> int:
    """Where `array`'s data starts. A ctypes view of the buffer says it ~4x faster than
    numpy's __array_interface__ (0.6 vs 2.5 us), which matters once per feed per run;
    read-only or empty arrays take the slow way."""
    try:
        return ctypes.addressof(_Byte.from_buffer(array))
    except (TypeError, ValueError):
        return int(array.__array_interface__["data"][0])


def _strings(values: Sequence[str]) -> Any:
    return (ctypes.c_char_p * max(len(values), 1))(*[v.encode() for v in values])


class NativeRunner:
    def __init__(self, *, policy: str, initializers: Mapping[str, np.ndarray]) -> None:
        if policy not in POLICIES:
            raise ModelLoadError(f"unknown select_session_policy {policy!r}")
        # Kept: ONNX Runtime reads these buffers for as long as the sessions live.
        self._arrays = {name: np.ascontiguousarray(a) for name, a in initializers.items()}
        shapes = {name: (ctypes.c_int64 * max(a.ndim, 1))(*a.shape) for name, a in self._arrays.items()}
        self._shapes = shapes
        inits = (_Initializer * max(len(self._arrays), 1))()
        for slot, (name, a) in zip(inits, self._arrays.items()):
            code = _ELEM_TYPES.get(a.dtype)
            if code is None:
                raise ModelLoadError(f"initializer {name!r} has dtype {a.dtype}, which the native runner cannot share")
            slot.name, slot.elem_type = name.encode(), code
            slot.shape, slot.rank = ctypes.cast(shapes[name], _i64p), a.ndim
            slot.data, slot.bytes = a.ctypes.data, a.nbytes
        err = ctypes.c_char_p()
        handle = _lib.rs_ort_runner_new(POLICIES[policy], inits, len(self._arrays), ctypes.byref(err))
        if not handle:
            raise ModelLoadError(f"cannot create the native runner: {_take_error(err)}")
        self._handle: int | None = handle
        self._names: dict[str, int] = {}
        self._name_keep: list[ctypes.c_char_p] = []
        self._output_arrays: dict[tuple[str, ...], Any] = {}
        self._threads = threading.local()

    @property
    def handle(self) -> int:
        """The runner pointer native code passes to the seam function."""
        if self._handle is None:
            raise InternalError("the native runner is closed")
        return self._handle

    @property
    def dense_run_address(self) -> int:
        """Address of `rs_ort_dense_run`, an `rs_dense_run_fn` (native/dense_run.h)."""
        return ctypes.cast(_lib.rs_ort_dense_run, ctypes.c_void_p).value or 0

    @property
    def session_count(self) -> int:
        return int(_lib.rs_ort_runner_session_count(self.handle))

    def add_session(
        self,
        model: str | bytes,
        values: SessionOptionValues,
        providers: ProviderList,
        *,
        cpus: Sequence[int] = (),
        where: str = "",
    ) -> None:
        """Create one more session of `model` (a path, or serialized ModelProto bytes)."""
        keys = [k for _, opts in providers for k in opts]
        vals = [opts[k] for _, opts in providers for k in opts]
        spec = _SessionSpec(
            intra_op_threads=values.intra or 0,
            inter_op_threads=values.inter or 0,
            parallel_execution=int(values.parallel),
            per_session_threads=int(values.per_session_threads),
            log_severity=values.log_severity,
            graph_optimization_level=-1,
            n_config=len(values.config),
            n_providers=len(providers),
            n_cpus=len(cpus),
        )
        keep = [
            _strings([k for k, _ in values.config]), _strings([v for _, v in values.config]),
            _strings([name for name, _ in providers]),
            (ctypes.c_size_t * max(len(providers), 1))(*[len(opts) for _, opts in providers]),
            _strings(keys), _strings(vals), (ctypes.c_int * max(len(cpus), 1))(*cpus),
        ]
        (spec.config_keys, spec.config_values, spec.provider_names, spec.provider_option_counts,
         spec.provider_keys, spec.provider_values, spec.cpus) = keep  # type: ignore[assignment]
        if isinstance(model, bytes):
            source, length = ctypes.c_char_p(model), len(model)
        else:
            source, length = ctypes.c_char_p(model.encode()), 0
        err = ctypes.c_char_p()
        status = _lib.rs_ort_runner_add_session(
            self.handle, ctypes.cast(source, ctypes.c_void_p), length, ctypes.byref(spec), ctypes.byref(err)
        )
        if status:
            raise ModelLoadError(f"onnxruntime cannot load {where or 'the model'}: {_take_error(err)}")

    def in_flight(self, index: int) -> int:
        """Runs in progress on session `index` that the runner's policy placed (`run`, the seam)."""
        return int(_lib.rs_ort_session_in_flight(self.handle, index))

    def providers(self, index: int) -> tuple[list[str], str]:
        """Session `index`'s providers in priority order, and ONNX Runtime's messages for
        the ones it refused ('' when none)."""
        names = ctypes.create_string_buffer(256)
        refused = ctypes.create_string_buffer(1024)
        if _lib.rs_ort_session_providers(self.handle, index, names, len(names), refused, len(refused)):
            raise IndexError(f"session {index} of {self.session_count}")
        return names.value.decode().split(","), refused.value.decode().strip()

    def _io(self, outputs: bool) -> list[OrtTensorInfo]:
        found = []
        name = ctypes.create_string_buffer(4096)
        elem = ctypes.c_int32()
        dims = (ctypes.c_int64 * _MAX_RANK)()
        rank = ctypes.c_size_t()
        for index in range(_lib.rs_ort_runner_io_count(self.handle, int(outputs))):
            err = ctypes.c_char_p()
            if _lib.rs_ort_runner_io(self.handle, int(outputs), index, name, len(name), ctypes.byref(elem),
                                     dims, ctypes.byref(rank), ctypes.byref(err)):
                raise ModelLoadError(_take_error(err))
            kind = _TYPE_NAMES.get(elem.value)
            found.append(OrtTensorInfo(
                name.value.decode(),
                f"tensor({kind})" if kind else "unknown",
                [d if d >= 0 else None for d in dims[: rank.value]],
            ))
        return found

    def get_inputs(self) -> list[OrtTensorInfo]:
        return self._io(False)

    def get_outputs(self) -> list[OrtTensorInfo]:
        return self._io(True)

    def _name(self, name: str) -> int:
        """Address of `name` as a NUL-terminated string, kept for the runner's life."""
        address = self._names.get(name)
        if address is None:
            encoded = ctypes.c_char_p(name.encode())
            self._name_keep.append(encoded)
            address = self._names.setdefault(name, ctypes.cast(encoded, ctypes.c_void_p).value or 0)
        return address

    def _output_names(self, names: Sequence[str]) -> Any:
        key = tuple(names)
        array = self._output_arrays.get(key)
        if array is None:
            array = (ctypes.c_char_p * max(len(key), 1))(*[n.encode() for n in key])
            self._output_arrays[key] = array
        return array

    def run(self, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Outputs of one run on the session the runner's policy picks (the seam's path)."""
        return self._run(-1, feeds, output_names)

    def run_on(self, index: int, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        """Outputs of one run on session `index`."""
        return self._run(index, feeds, output_names)

    def _run(self, index: int, feeds: Mapping[str, np.ndarray], output_names: Sequence[str]) -> list[np.ndarray]:
        # The feeds go as one int64 buffer, five words per input (name address, element type,
        # offset of its dims in the buffer, rank, data address) and then every dim, built from
        # one list: per-field ctypes assignments cost ~30x more (27 feeds: ~120 us vs ~4 us).
        arrays = []
        words: list[int] = []
        dims: list[int] = []
        for name, value in feeds.items():
            array = value if type(value) is np.ndarray and value.flags.c_contiguous else np.ascontiguousarray(value)
            code = _ELEM_TYPES.get(array.dtype)
            if code is None:
                raise RequestError(
                    f"the model rejected the inputs: input {name!r} has dtype {array.dtype}; the native runner "
                    f"feeds {', '.join(sorted(str(d) for d in _ELEM_TYPES))}"
                )
            arrays.append(array)
            words += (self._name(name), code, len(dims), array.ndim, _address(array))
            dims += array.shape
        count = len(arrays)
        packed = array_module.array("q", words + dims or [0])
        base = packed.buffer_info()[0]
        n_out = len(output_names)
        scratch = self._scratch(n_out)
        status = _lib.rs_ort_run_any(
            self.handle, index, base, count, self._output_names(output_names), n_out, scratch.outs_at, scratch.err_at
        )
        del arrays, packed  # the run has returned: ONNX Runtime no longer reads the feeds
        if status == 400:
            raise RequestError(f"the model rejected the inputs: {_take_error(scratch.err)}")
        if status:
            raise InternalError(f"onnxruntime failed to run the model: {_take_error(scratch.err)}")
        try:
            results = []
            # each rs_tensor_out read as 12 int64 words: elem_type, shape[8], rank, data, bytes
            for row in scratch.words[:n_out].tolist():
                array = np.empty(tuple(row[1 : 1 + row[9]]), _DTYPES[row[0] & 0xFFFFFFFF])
                if row[11]:
                    ctypes.memmove(_address(array), row[10], row[11])
                results.append(array)
            return results
        finally:
            _lib.rs_ort_free_outputs(scratch.outs_at, n_out)

    def _scratch(self, n_out: int) -> _Scratch:
        """This thread's output descriptors (reused: each run's outputs are copied out before it returns)."""
        scratch: _Scratch | None = getattr(self._threads, "scratch", None)
        if scratch is None or len(scratch.outs) < n_out:
            scratch = self._threads.scratch = _Scratch(max(n_out, 8))
        return scratch

    def close(self) -> None:
        """Release the sessions; only after every run has returned."""
        if self._handle is not None:
            _lib.rs_ort_runner_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        # At interpreter exit the module's globals may be gone already; the process is
        # ending, so the sessions need no release then.
        if _lib is not None:
            self.close()
