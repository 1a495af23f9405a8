"""A group of ONNX Runtime sessions over one dense graph (DeepRec's SessionGroup).

`session_count` sessions (session_num per GPU, or session_num on the CPU) share every
large dense initializer: each is loaded once, with the version's `dense.safetensors`
overrides applied, and handed to every session as the same buffer
(`recserve.runtime.shared_weights`). Each session has its own thread pools (or the
process-wide ones), its own CPU group, its own device and stream; a request is served by
the session `select_session_policy` picks, or, with dynamic batching on, merged with
other requests by `recserve.processor.batching`. Thread-safe: `run` may be called from
many threads; `close` once, after the last `run`.

The sessions are ONNX Runtime C API sessions (`recserve.runtime.native_runner`): runs
release the GIL from start to end and native code (the request route) can call the same
sessions without Python. The Python binding's `InferenceSession`s are used instead -- never
both, so the weights are never held twice -- when RECSERVE_NATIVE_DENSE=0, when a graph
input or output is a string (the C runner feeds and returns numeric tensors only), and
when a model asks for ONNX Runtime's global thread pools after this process's C API env
was created without them (the env is one per process and gets its pools at creation), and
when a shared initializer has a dtype the C runner cannot wrap (bfloat16, complex).
Traced requests that want an ONNX Runtime profile always run on a fresh Python session.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort

from recserve.config import ProcessorConfig
from recserve.errors import ConfigError, InternalError, ModelLoadError, RequestError
from recserve.processor.batching import DynamicBatcher
from recserve.processor.signature import GraphTensor
from recserve.processor.trace import RequestTrace
from recserve.runtime import native_runner
from recserve.runtime.cpus import check_cpusets, pin_calling_thread
from recserve.runtime.cuda_streams import CudaStreams
from recserve.runtime.input_concat import InputConcat, fold_input_concat
from recserve.runtime.native_runner import NativeRunner
from recserve.runtime.providers import DeviceSettings, ProviderList, check_providers, provider_list
from recserve.runtime.session_options import ThreadSettings, build_session_options, session_option_values
from recserve.runtime.session_policy import SessionPolicy
from recserve.runtime.shared_weights import SharedInitializers
from recserve.runtime.string_feeds import as_ort_strings
from recserve.runtime.threads import global_thread_pools, use_global_thread_pools

__all__ = ["PREPACK_AUTO_MAX_BYTES", "SessionGroup", "device_settings", "prepacks", "thread_settings"]

log = logging.getLogger("recserve.processor")

_MAX_REMEMBERED_THREADS = 4096
_EPFail = ort.capi.onnxruntime_pybind11_state.EPFail


def thread_settings(config: ProcessorConfig, index: int, *, per_session_threads: bool = True) -> ThreadSettings:
    """Session `index`'s CPU threads as the config asks."""
    return ThreadSettings(
        intra=config.intra_op_parallelism_threads,
        inter=config.inter_op_parallelism_threads,
        per_session_threads=per_session_threads,
        inline=config.enable_inline_execute,
        spinning=config.allow_spinning,
        cpus=config.cpusets[index] if config.cpusets else (),
    )


def device_settings(config: ProcessorConfig, index: int, stream: int | None = None) -> DeviceSettings:
    """Session `index`'s device: GPU `gpu_ids_list[index // session_num]` (GPU 0 when the
    list is empty) for cuda and tensorrt."""
    provider = config.execution_provider
    if provider == "auto":
        provider = "cuda" if config.gpu_ids_list else "cpu"
    gpus = config.gpu_ids_list or (0,)
    return DeviceSettings(
        provider=provider,  # type: ignore[arg-type]  # checked by the config's choice()
        device_id=gpus[index // config.session_num] if provider != "cpu" else 0,
        stream=stream,
        trt_fp16=config.trt_fp16_enable,
        trt_engine_cache_path=config.trt_engine_cache_path,
        max_batch_size=config.max_batch_size,
    )


# prepack_weights "auto" prepacks only where it costs one extra copy of at most this much.
PREPACK_AUTO_MAX_BYTES = 256 * 2**20


def prepacks(config: ProcessorConfig, shared_bytes: int, *, one_packed_copy: bool = False) -> bool:
    """Whether the sessions prepack MatMul/Gemm weights: prepack_weights, "auto" decided.
    Prepacked weights run faster (the DLRM MLP at batch 1: ~35% less time per run, and a
    smaller cache footprint for the rest of the request) and cost a packed copy: one for the
    whole group where the sessions share it (`one_packed_copy`: the native runner's prepacked
    weights container), else one per session (the Python binding has no such container).
    Sessions that pack differently also round differently (a few float32 ulps), so a group
    answers alike whatever its session_num only where one copy serves them all."""
    if config.prepack_weights == "auto":
        return (one_packed_copy or config.session_count == 1) and shared_bytes <= PREPACK_AUTO_MAX_BYTES
    return bool(config.prepack_weights)


def _input_shapes(model: onnx.ModelProto) -> list[tuple[str, tuple[int | None, ...]]]:
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    return [
        (i.name, tuple(d.dim_value if d.HasField("dim_value") else None for d in i.type.tensor_type.shape.dim))
        for i in graph.input
        if i.name not in initializers
    ]


def _graph_tensor(value: onnx.ValueInfoProto) -> GraphTensor:
    elem_type = value.type.tensor_type.elem_type
    dtype = np.dtype(object) if elem_type == onnx.TensorProto.STRING else onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim)
    return GraphTensor(value.name, np.dtype(dtype), dims)


def _with_inputs_folded(model_path: str) -> tuple[onnx.ModelProto, InputConcat | None, list[onnx.ValueInfoProto]]:
    """The graph the sessions load (a Concat of inputs folded out of it where one is, see
    recserve.runtime.input_concat), and the graph inputs as written, which requests feed."""
    try:
        model = onnx.load(model_path, load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ValueError...
        raise ModelLoadError(f"cannot read ONNX model {model_path}: {exc}") from exc
    written = list(model.graph.input)
    # A model with external data loads by path (ONNX Runtime finds the data beside it).
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        return model, None, written
    return model, fold_input_concat(model), written


def _check_batchable(tensors: Sequence[GraphTensor], what: str) -> None:
    for t in tensors:
        if not t.shape or t.shape[0] is not None:
            raise ModelLoadError(
                f"max_batch_size > 0 merges requests along the first dimension, but graph {what} "
                f"{t.name!r} has shape {['?' if d is None else d for d in t.shape]}; dynamic batching "
                "needs a free first (batch) dimension on every input and output (or set max_batch_size 0)"
            )


def _native_types(model: onnx.ModelProto) -> bool:
    """Whether every graph input and output is a tensor the C API runner can carry."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    for value in [*(i for i in graph.input if i.name not in initializers), *graph.output]:
        elem_type = value.type.tensor_type.elem_type
        if not value.type.HasField("tensor_type") or elem_type == onnx.TensorProto.STRING:
            return False
        try:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        except (KeyError, ValueError):
            return False
        if not native_runner.native_dtype(dtype):
            return False
    return True


def _wants_global_pools(config: ProcessorConfig) -> bool:
    return not config.use_per_session_threads and config.ort_global_thread_pools and not config.enable_inline_execute


def _native_env(config: ProcessorConfig, model: onnx.ModelProto) -> bool:
    """Whether this group runs on the C API runner; creates the process's C API env if it
    does. RECSERVE_NATIVE_DENSE=0 turns the C API runner off."""
    if os.environ.get("RECSERVE_NATIVE_DENSE", "1") == "0" or not _native_types(model):
        return False
    pools = None
    if _wants_global_pools(config):
        pools = (config.intra_op_parallelism_threads, config.inter_op_parallelism_threads, config.allow_spinning)
    try:
        native_runner.onnxruntime_library()
    except ModelLoadError as exc:  # an onnxruntime package without its C library
        log.warning("serving on Python ONNX Runtime sessions: %s", exc)
        return False
    try:
        native_runner.use_env(pools)
    except ModelLoadError as exc:  # the env exists without the global pools this model wants
        log.info("serving on Python ONNX Runtime sessions: %s", exc)
        return False
    return True


def _uses_own_pools(config: ProcessorConfig, native: bool = False) -> bool:
    """Whether the sessions get their own pools; creates the global pools when they do not.

    ONNX Runtime's global pools are opt-in (use_per_session_threads false *and*
    ort_global_thread_pools true): once they exist, ONNX Runtime refuses a session with
    its own pools anywhere in the process, other models' and helper sessions included."""
    existing = global_thread_pools()
    if _wants_global_pools(config):
        use_global_thread_pools(
            config.intra_op_parallelism_threads, config.inter_op_parallelism_threads, python_binding=not native
        )
        return False
    if existing is not None:
        raise ConfigError(
            "this model's sessions need their own thread pools, but this process already created ONNX "
            "Runtime's global pools (for a model with ort_global_thread_pools true) and ONNX Runtime "
            "cannot mix the two in one process; set use_per_session_threads false and "
            "ort_global_thread_pools true for every model of the process, or for none",
            field="ort_global_thread_pools",
        )
    return True


class SessionGroup:
    def __init__(
        self,
        model_path: str,
        config: ProcessorConfig,
        *,
        dense_overrides: Mapping[str, np.ndarray] | None = None,
        partial_dense: bool = False,
    ) -> None:
        count = config.session_count
        self._policy = SessionPolicy(config.select_session_policy, count)
        self._cpusets = config.cpusets
        if self._cpusets:
            check_cpusets(self._cpusets)
        graph, self.concat, written_inputs = _with_inputs_folded(model_path)
        # ORT keeps pointers to the shared buffers and streams: they live as long as the group.
        self._shared = SharedInitializers(model_path, dense_overrides, partial=partial_dense)
        shared_native = all(native_runner.native_dtype(a.dtype) for a in self._shared.arrays.values())
        native = shared_native and _native_env(config, graph)
        per_session_threads = _uses_own_pools(config, native)
        self.dense_overrides = self._shared.overridden
        self.prepacking = prepacks(config, self._shared.nbytes, one_packed_copy=native)
        self._streams = CudaStreams()
        self._sessions: list[ort.InferenceSession] = []
        self._direct_runs: list[Any] = []
        self._native: NativeRunner | None = None
        self._count = 0
        self._configs: list[dict[str, str]] = []
        self._pinned: dict[int, int] = {}
        self._pin_lock = threading.Lock()
        self._batcher: DynamicBatcher | None = None
        self._source: str | bytes = model_path if self.concat is None else graph.SerializeToString()
        shapes = _input_shapes(graph)
        del graph
        self._profile_settings: tuple[ThreadSettings, bool, list[Any]] | None = None
        self._string_inputs: tuple[str, ...] = ()
        try:
            if native:
                self._native = NativeRunner(policy=config.select_session_policy, initializers=self._shared.arrays)
            for index in range(count):
                device = device_settings(config, index)
                if config.use_multi_stream and device.provider != "cpu":
                    device = device_settings(config, index, self._streams.create(device.device_id))
                providers = provider_list(device, shapes)
                threads = thread_settings(config, index, per_session_threads=per_session_threads)
                where = f"session {index} of {model_path}"
                self._configs.append(dict(session_option_values(threads, prepacking=self.prepacking).config))
                if self._native is not None:
                    self._add_native(model_path, threads, providers, config, where)
                else:
                    self._add_python(model_path, threads, providers, config, where)
                self._count += 1
                if self._profile_settings is None:
                    self._profile_settings = (threads, self.prepacking, providers)
            first: Any = self._native if self._native is not None else self._sessions[0]
            by_name = {a.name: a for a in first.get_inputs()}
            # What requests feed: the graph's inputs as written, whatever the sessions fold.
            self.inputs = [
                GraphTensor.from_ort(by_name[v.name]) if v.name in by_name else _graph_tensor(v)
                for v in written_inputs
                if v.name in by_name or (self.concat is not None and v.name in self.concat.parts)
            ]
            self.outputs = [GraphTensor.from_ort(a) for a in first.get_outputs()]
            self._string_inputs = tuple(t.name for t in self.inputs if t.dtype == np.dtype(object))
            if config.max_batch_size > 0:
                _check_batchable(self.inputs, "input")
                _check_batchable(self.outputs, "output")
                self._batcher = DynamicBatcher(
                    self._run_on,
                    sessions=count,
                    max_batch_size=config.max_batch_size,
                    batch_timeout_micros=config.batch_timeout_micros,
                    on_worker_start=self._pin if self._cpusets else None,
                )
        except BaseException:
            self.close()
            raise

    def _add_python(
        self, model_path: str, threads: ThreadSettings, providers: ProviderList, config: ProcessorConfig, where: str
    ) -> None:
        options = build_session_options(threads, prepacking=self.prepacking)
        self._shared.add_to(options)
        try:
            session = ort.InferenceSession(self._source, options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelLoadError(f"onnxruntime cannot load {model_path}: {exc}") from exc
        check_providers(session, providers, allow_cpu_fallback=config.allow_cpu_fallback, where=where)
        self._sessions.append(session)
        self._direct_runs.append(getattr(session, "_sess", session).run)

    def _add_native(
        self, model_path: str, threads: ThreadSettings, providers: ProviderList, config: ProcessorConfig, where: str
    ) -> None:
        assert self._native is not None
        values = session_option_values(threads, prepacking=self.prepacking)
        self._native.add_session(self._source, values, providers, cpus=threads.cpus, where=model_path)
        got, refused = self._native.providers(self._count)
        if refused:
            log.warning("%s: onnxruntime refused %s", where, refused.replace("\n", "; "))
        check_providers(
            SimpleNamespace(get_providers=lambda: got), providers,
            allow_cpu_fallback=config.allow_cpu_fallback, where=where,
        )

    @property
    def native_runner(self) -> NativeRunner | None:
        """The C API runner, for native callers (its handle and seam function); None when
        this group runs on Python sessions (see the module docstring for when)."""
        return self._native

    @property
    def session_count(self) -> int:
        return self._count

    @property
    def shared_weight_names(self) -> list[str]:
        """Initializers every session reads from one shared buffer."""
        return self._shared.names

    def session_config(self, index: int) -> dict[str, str]:
        """The session config entries session `index` was created with."""
        return dict(self._configs[index])

    def providers(self, index: int) -> list[str]:
        """The providers session `index` really runs with."""
        if self._native is not None:
            return self._native.providers(index)[0]
        return list(self._sessions[index].get_providers())

    def run(
        self,
        output_names: Sequence[str],
        feeds: Mapping[str, np.ndarray],
        *,
        session: int | None = None,
        trace: RequestTrace | None = None,
        merged: bool = False,
    ) -> list[np.ndarray]:
        """Outputs of one run. `session` picks the session (warmup reaches each one);
        a `trace` that wants an ONNX Runtime profile gets one (timelines); `merged`: the
        feeds are already a merge of requests (recserve.processor.merged_runs), so they run
        now instead of waiting in the dynamic batcher."""
        if trace is not None and trace.want_ort_profile:
            return self._run_profiled(output_names, feeds, trace)
        if session is not None:
            return self._run_on(session, output_names, feeds)
        if self._batcher is not None and not merged:
            return self._batcher.submit(output_names, feeds)
        index = self._policy.acquire()
        try:
            if self._cpusets:
                self._pin(index)
            return self._run_on(index, output_names, feeds)
        finally:
            self._policy.release(index)

    def _pin(self, index: int) -> None:
        """Move the calling thread to session `index`'s CPUs unless it is there already."""
        ident = threading.get_ident()
        if self._pinned.get(ident) == index:
            return
        pin_calling_thread(self._cpusets[index])
        with self._pin_lock:
            if len(self._pinned) >= _MAX_REMEMBERED_THREADS:
                self._pinned.clear()
            self._pinned[ident] = index

    def _feed(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        feed = feeds if type(feeds) is dict else dict(feeds)
        # Route feeds come folded already (request_route); other paths' are folded here.
        if self.concat is not None and self.concat.output not in feed:
            try:
                return self.concat.fold(feed)
            except ValueError as exc:  # the parts' batch sizes differ
                raise RequestError(f"the model rejected the inputs: {exc}") from exc
        return feed

    def _binding_feed(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`feed` for the Python binding's sessions: string inputs as text (string_feeds)."""
        for name in self._string_inputs:
            if name in feed:
                feed = {**feed, name: as_ort_strings(name, feed[name])}
        return feed

    def _run_on(self, index: int, output_names: Sequence[str], feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        names = output_names if type(output_names) is list else list(output_names)
        feed = self._feed(feeds)
        if self._native is not None:
            return self._native.run_on(index, feed, names)  # raises RequestError / InternalError itself
        feed = self._binding_feed(feed)
        try:
            try:
                # The pybind session's run: InferenceSession.run is this call after checks the
                # signature has already made (every input present; for the 27-input DLRM
                # model ~10 us of property reads per request).
                return self._direct_runs[index](names, feed, None)  # type: ignore[no-any-return]
            except _EPFail:
                return self._sessions[index].run(names, feed)  # type: ignore[no-any-return]  # falls back to CPU if allowed
        except ort.capi.onnxruntime_pybind11_state.InvalidArgument as exc:
            raise RequestError(f"the model rejected the inputs: {exc}") from exc
        except Exception as exc:
            raise InternalError(f"onnxruntime failed to run the model: {exc}") from exc

    def _run_profiled(
        self, output_names: Sequence[str], feeds: Mapping[str, np.ndarray], trace: RequestTrace
    ) -> list[np.ndarray]:
        # ORT profiles a session from its creation until end_profiling() and cannot restart,
        # so a traced request runs on a fresh session with session 0's settings. Timelines
        # trace a handful of requests, so the load this costs is rare by design.
        assert self._profile_settings is not None
        threads, prepacking, providers = self._profile_settings
        options = build_session_options(threads, prepacking=prepacking)
        options.enable_profiling = True
        options.profile_file_prefix = os.path.join(tempfile.gettempdir(), f"recserve-ort-{os.getpid()}")
        self._shared.add_to(options)
        try:
            profiled = ort.InferenceSession(self._source, options, providers=providers)
            outputs = profiled.run(list(output_names), self._binding_feed(self._feed(feeds)))
        except ort.capi.onnxruntime_pybind11_state.InvalidArgument as exc:
            raise RequestError(f"the model rejected the inputs: {exc}") from exc
        except Exception as exc:
            raise InternalError(f"onnxruntime failed to run the model: {exc}") from exc
        trace.ort_profile_path = profiled.end_profiling()
        return outputs  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._batcher is not None:
            self._batcher.close()
            self._batcher = None
        self._sessions.clear()
        self._direct_runs.clear()
        if self._native is not None:
            self._native.close()
            self._native = None
        self._count = 0
        self._streams.close()
