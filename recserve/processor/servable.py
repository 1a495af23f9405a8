"""One servable model version: embedding tables, a session group and the signatures.

Built off the request path by `Servable.load`; immutable afterwards except for table rows
that deltas update in place under the embedding engine's row rule. Thread-safe.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from recserve.config import ProcessorConfig
from recserve.embedding import DuplicateKeyError, EmbeddingTable, IntegerKeys, LookupPlan, StringKeys, tier_spec
from recserve.embedding.redis_store import RedisTableSet, open_redis_tables
from recserve.errors import CorruptVersionError, ModelLoadError, RecserveError, RequestError
from recserve.model_spec import EmbeddingBinding, ModelSpec
from recserve.model_store.checkpoint import Checkpoint, bound_table_rows, duplicate_key_error, table_file
from recserve.model_store.load_threads import map_in_threads
from recserve.model_store.manifest import TF_BUNDLE_FORMAT
from recserve.model_store.model_dir import ModelDir
from recserve.model_store.table_data import mod_partition_ids
from recserve.model_store.tf_checkpoint import dense_by_initializer
from recserve.model_store.updater import apply_delta
from recserve.processor.merged_runs import process_merged
from recserve.processor.native_route import NativeServable, native_servable
from recserve.processor.request_route import RequestRoute
from recserve.processor.session_group import SessionGroup
from recserve.processor.signature import DEFAULT_SIGNATURE, GraphTensor, Signature, build_signatures
from recserve.processor.trace import RequestTrace
from recserve.runtime.placed_inputs import PlacedInputs
from recserve.runtime.placement import PlacedModel
from recserve.wire import codec

if TYPE_CHECKING:
    from recserve.wire._codec_native import ParsedRequest

__all__ = ["Servable", "build_tables"]


def build_tables(
    bindings: Sequence[EmbeddingBinding], checkpoint: Checkpoint, config: ProcessorConfig, model_name: str,
    progress: Callable[[int], None] | None = None, names: Callable[[str], str] = str,
) -> dict[str, EmbeddingTable]:
    """One EmbeddingTable per bound table name, from the checkpoint's rows; on DRAM + SSD
    tiers (`ev_storage_type` 12) under ev_storage_path/<model>/<version>/<table>."""
    def build(item: tuple[str, tuple[EmbeddingBinding, Any]]) -> EmbeddingTable | Exception:
        name, (b, data) = item
        try:
            table = EmbeddingTable(
                name, b.dim, data.keys, data.values, default=b.default, freqs=data.freqs, versions=data.versions,
                storage=tier_spec(config, model=model_name, version=checkpoint.ref.name, table=name),
            )
            entry = checkpoint.manifest.files.get(table_file(name))
            if progress is not None and entry is not None:
                progress(entry.size)
            return table
        except DuplicateKeyError as exc:
            return duplicate_key_error(checkpoint, names(name), f"keys hold {exc.key} more than once; keys must be unique")
        except Exception as exc:  # noqa: BLE001  (raised below, once every other table is closed)
            # Without its frames: a traceback made on a pool thread reaches the pool's work
            # item through the frames' f_back, which holds this error as its result, a cycle
            # that kept the failed version's rows (files open, a full SSD tier's space) until
            # the cyclic collector ran. The message names the table and the cause.
            cause: BaseException | None = exc
            while cause is not None:
                cause.__traceback__ = None
                cause = cause.__cause__ or cause.__context__
            return exc

    rows = bound_table_rows(bindings, checkpoint, names, engine_checks_keys=True)
    # Tables build side by side: the copy into the engine's layout and the index build
    # release the GIL (recserve.model_store.load_threads).
    built = map_in_threads(build, rows.items())
    tables = {name: t for name, t in zip(rows, built) if isinstance(t, EmbeddingTable)}
    failed = next((t for t in built if isinstance(t, Exception)), None)
    if failed is not None:
        for table in tables.values():
            table.close()
        try:
            raise failed
        finally:
            failed = built = None  # the error's traceback holds this frame: no cycle through it
    return tables


def placed_tables(placed: PlacedModel, checkpoint: Checkpoint, names: Callable[[str], str] = str,
                  ) -> dict[str, EmbeddingTable]:
    """Tables moved out of a plain ONNX graph, keyed by row index; a version's
    `embedding/<initializer>.safetensors` rows replace those rows (DESIGN §4)."""
    tables = {}
    for name, rows in placed.tables.items():
        table = EmbeddingTable(name, rows.shape[1], np.arange(len(rows), dtype=np.int64), rows)
        data = checkpoint.tables.get(names(name))
        if data is not None:
            try:
                data.require_unique()  # upsert would keep a repeated key's last row silently
            except CorruptVersionError as exc:
                raise duplicate_key_error(checkpoint, names(name), str(exc)) from exc
            if data.values.shape[1] != rows.shape[1]:
                raise ModelLoadError(
                    f"table {name!r} in version {checkpoint.ref.name!r} has dim {data.values.shape[1]}, "
                    f"but the graph's initializer has dim {rows.shape[1]}"
                )
            table.upsert(data.keys, data.values)
        tables[name] = table
    return tables


def placed_bindings(placed: PlacedModel) -> tuple[EmbeddingBinding, ...] | None:
    """The placed model's lookups as model.json bindings (combiner "none", unknown ids get
    zeros, as the placed path gives them), when each one reads an integer request input of
    rank 1 or 2 that nothing else reads; None otherwise (ids computed by the ids graph, one
    id input feeding two tables or the dense graph too), and the placed path serves it."""
    types = {name: (dtype, shape) for name, dtype, shape in placed.request_input_types}
    readers: dict[str, int] = {}
    for lookup in placed.lookups:
        readers[lookup.ids] = readers.get(lookup.ids, 0) + 1
    shared = set(placed.dense_request_inputs) | set(placed.ids_inputs)
    bindings = []
    for lookup in placed.lookups:
        dtype, shape = types.get(lookup.ids, (None, ()))
        if (dtype is None or dtype.kind not in "iu" or len(shape) not in (1, 2)
                or readers[lookup.ids] != 1 or lookup.ids in shared):
            return None
        dim = int(placed.tables[lookup.table].shape[1])
        bindings.append(EmbeddingBinding(input=lookup.ids, table=lookup.table, dim=dim, graph_input=lookup.graph_input))
    return tuple(bindings)


@dataclass
class Servable:
    version: str
    global_step: int
    model: ModelDir
    tables: Mapping[str, Any]  # EmbeddingTable, or RedisTable with feature_store_type redis
    sessions: SessionGroup
    signatures: Mapping[str, Signature]
    default_signature: str
    loaded_at: float
    # Per signature, computed once: (alias, graph input) of its dense inputs; (alias, graph
    # input, ids are strings) of its id inputs; one plan looking all the ids up per request.
    plans: Mapping[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str, bool], ...], Any]]
    # Plain ONNX models under enable_device_placement_optimization: ids -> rows on the CPU.
    placed: PlacedInputs | None = None
    redis: RedisTableSet | None = None
    # Request layout (the native parser's) -> its route; see request_route. Filled as
    # layouts arrive; races only cost a rebuild.
    routes: dict[bytes, RequestRoute] = field(default_factory=dict)
    # The version's dense parameters (what the sessions were built with): worker processes
    # build their own sessions from them.
    dense_overrides: Mapping[str, np.ndarray] = field(default_factory=dict)
    # The newest delta applied to this version (set_delta_step, after each one).
    delta_step: int = 0
    # False once a newer servable took these tables over (an in-place full update): close()
    # then leaves them to it.
    owns_tables: bool = True
    # Called once close() is done (a worker tells the leader it let go of the version).
    on_close: Callable[[], None] | None = None
    # Called after each delta is applied (the leader of worker processes tells the workers
    # which keys changed in Redis, so they drop them from their caches).
    on_delta: Callable[[Checkpoint], None] | None = None
    # The native request route's part of this version (native_route.NativeServable), or
    # None when its requests need Python (Redis tables, a placed ids graph).
    native: NativeServable | None = None

    @classmethod
    def load(
        cls,
        model: ModelDir,
        checkpoint: Checkpoint,
        config: ProcessorConfig,
        *,
        placed: PlacedModel | None = None,
        model_name: str = "default",
        progress: Callable[[int], None] | None = None,
        tables: Mapping[str, EmbeddingTable] | None = None,
    ) -> Servable:
        """Build the version; with `tables`, serve those (a worker process: the leader's
        tables in the shared arena) instead of building them from the checkpoint."""
        redis: RedisTableSet | None = None
        if config.uses_redis:
            if placed is not None:
                raise ModelLoadError(
                    "feature_store_type redis serves tables bound in model.json; a plain ONNX model "
                    "under enable_device_placement_optimization keeps its tables in the process"
                )
            redis = open_redis_tables(
                model.spec.embeddings, checkpoint, config, model_name, reload=checkpoint.with_tables,
                names=model.spec.checkpoint_name,
            )
        try:
            return cls._load(model, checkpoint, config, placed, redis, model_name, progress, tables)
        except BaseException:
            if redis is not None:
                redis.close()
            raise

    @classmethod
    def _load(
        cls,
        model: ModelDir,
        checkpoint: Checkpoint,
        config: ProcessorConfig,
        placed: PlacedModel | None,
        redis: RedisTableSet | None,
        model_name: str,
        progress: Callable[[int], None] | None = None,
        given: Mapping[str, EmbeddingTable] | None = None,
    ) -> Servable:
        tables: Mapping[str, Any]
        # A TensorFlow checkpoint holds every variable: the initializers take theirs, by name
        # or through model.json's checkpoint_names, and the rest is never read (DESIGN §4b).
        from_tf = checkpoint.manifest.format == TF_BUNDLE_FORMAT
        dense = dense_by_initializer(checkpoint.dense, model.spec.checkpoint_names) if from_tf else checkpoint.dense
        names = model.spec.checkpoint_name
        if redis is not None:
            tables = redis.tables
            sessions = SessionGroup(model.onnx_path, config, dense_overrides=dense, partial_dense=from_tf)
            signatures = build_signatures(model.spec, sessions.inputs, sessions.outputs)
        elif placed is None:
            tables = given if given is not None else build_tables(
                model.spec.embeddings, checkpoint, config, model_name, progress, names)
            sessions = SessionGroup(model.onnx_path, config, dense_overrides=dense, partial_dense=from_tf)
            signatures = build_signatures(model.spec, sessions.inputs, sessions.outputs)
        else:
            tables = given if given is not None else placed_tables(placed, checkpoint, names)
            sessions = SessionGroup(placed.dense_model_path, config, dense_overrides=dense, partial_dense=from_tf)
            bindings = placed_bindings(placed)
            if bindings is not None:
                # Every Gather reads a request input as it is: the model is a model.json model
                # in all but name, so it takes the same request routes (one lookup plan).
                signatures = build_signatures(ModelSpec(embeddings=bindings), sessions.inputs, sessions.outputs)
                placed = None
            else:
                request_inputs = [GraphTensor(n, np.dtype(t), shape) for n, t, shape in placed.request_input_types]
                signatures = build_signatures(ModelSpec(), request_inputs, sessions.outputs)
        default_signature = config.signature_name or ""
        default = default_signature or DEFAULT_SIGNATURE
        if default not in signatures:
            # DeepRec serves the model's only signature whatever it is called.
            if default_signature or len(signatures) != 1:
                raise ModelLoadError(
                    f"signature_name {default!r} is not in the model; it has {sorted(signatures)}"
                )
            default = next(iter(signatures))
        plans = {}
        for name, sig in signatures.items():
            dense = tuple((a, spec.name) for a, spec in sig.inputs.items() if spec.binding is None)
            bindings = [(a, spec.binding) for a, spec in sig.inputs.items() if spec.binding is not None]
            bound = tuple((a, b.graph_input, binding_keys(b)) for a, b in bindings)
            pairs = [(b.table, b.combiner) for _, b in bindings]
            plan = redis.lookup_plan(pairs) if redis else LookupPlan([(tables[t], c) for t, c in pairs])
            plans[name] = (dense, bound, plan)
        servable = cls(
            version=checkpoint.ref.name,
            global_step=checkpoint.manifest.global_step,
            model=model,
            tables=tables,
            sessions=sessions,
            signatures=signatures,
            default_signature=default,
            loaded_at=time.time(),
            plans=plans,
            placed=PlacedInputs(placed) if placed is not None else None,
            redis=redis,
            dense_overrides=sessions.dense_overrides,
        )
        servable.native = native_servable(servable)
        return servable

    def process(self, data: bytes, trace: RequestTrace) -> bytes:
        """PredictResponse bytes for PredictRequest bytes; raises RecserveError. Requests the
        native parser takes are served by their layout's route (in-process tables only)."""
        start = time.perf_counter_ns()
        parsed = codec.parse_request(data) if self.placed is None and self.redis is None else None
        outputs = self.serve(parsed, lambda: codec.decode_request(data), trace, start)
        start = time.perf_counter_ns()
        response = codec.encode_response(outputs)
        trace.add("encode", start)
        return response

    def serve(self, parsed: ParsedRequest | None, decode: Callable[[], codec.DecodedRequest], trace: RequestTrace,
              start: int) -> dict[str, np.ndarray]:
        """The outputs of a request parsed natively (`parsed`, consumed) or else decoded by
        `decode`, by its layout's route when it has one; raises RecserveError. `start`: when
        decoding began (perf_counter_ns), for the trace. Any protocol whose parser gives
        ParsedRequests (EAS, TF Serving's gRPC) serves through here."""
        route = None
        if parsed is not None and self.placed is None and self.redis is None:
            # Routes serve in-process tables only: otherwise the parsed arrays go the general way.
            route = self.route(parsed)
        if route is None:
            # Parsed but not routable: its arrays, not a second parse.
            request = decode() if parsed is None else codec.DecodedRequest(
                parsed.recipe.signature_name, parsed.inputs(), parsed.recipe.output_filter)
            trace.add("decode", start)
            outputs = self.predict(
                request.inputs, request.output_filter, signature_name=request.signature_name or None, trace=trace
            )
        else:
            assert parsed is not None   # a route is only ever found for a parsed request
            feeds = self.routed_feeds(route, parsed, trace, start)
            start = time.perf_counter_ns()
            outputs = dict(zip(route.output_keys, self.sessions.run(route.output_names, feeds, trace=trace)))
            trace.add("run", start)
        return outputs

    def routed_feeds(self, route: RequestRoute, parsed: ParsedRequest, trace: RequestTrace,
                     decode_start: int) -> dict[str, np.ndarray]:
        """The graph's feeds for a request its layout's route serves, its decode (from
        `decode_start`, perf_counter_ns) and lookup traced."""
        trace.add("decode", decode_start)
        trace.batch_size = route.batch_size
        trace.model_version = self.version
        trace.delta_step = self.delta_step
        start = time.perf_counter_ns()
        feeds = route.feeds(parsed)
        trace.add("lookup", start)
        return feeds

    def process_many(self, payloads: Sequence[bytes], traces: Sequence[RequestTrace],
                     max_rows: int) -> list[bytes | RecserveError]:
        """Each payload's answer as `process` gives it (PredictResponse bytes, or the error it
        raises), the requests that agree in layout merged into runs of up to `max_rows`
        rows (recserve.processor.merged_runs)."""
        return process_merged(self, payloads, traces, max_rows)

    def route(self, parsed: ParsedRequest) -> RequestRoute | None:
        """The route of `parsed`'s layout (built and validated on its first request: raises
        RequestError); None when its layout cannot be served in place."""
        return self.routes.get(parsed.layout) or self._route(parsed)

    _MAX_ROUTES = 1024

    def _route(self, parsed: ParsedRequest) -> RequestRoute | None:
        """The route of the first request of a layout, validated the general way (raises
        RequestError); None when its layout cannot be served in place."""
        recipe = parsed.recipe
        sig = self.signature(recipe.signature_name or None)
        arrays = sig.resolve_inputs(parsed.inputs())
        chosen = sig.resolve_outputs(recipe.output_filter)
        dense, bound, plan = self.plans[sig.name]
        route = RequestRoute.build(sig, plan, dense, bound, parsed, arrays, chosen, self.sessions.concat)
        if route is not None:
            if len(self.routes) >= self._MAX_ROUTES:
                self.routes.clear()
            self.routes[parsed.layout] = route
            if self.native is not None:
                self.native.add(parsed.layout, route)
        return route

    def signature(self, name: str | None) -> Signature:
        sig = self.signatures.get(name or self.default_signature)
        if sig is None:
            raise RequestError(
                f"unknown signature_name {name!r}; this model has {sorted(self.signatures)}"
            )
        return sig

    def predict(
        self,
        inputs: Mapping[str, Any],
        output_filter: Sequence[str] | None = None,
        *,
        signature_name: str | None = None,
        trace: RequestTrace | None = None,
        session: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Outputs for one request; `session` pins the run to one session (warmup)."""
        trace = trace or RequestTrace()
        sig = self.signature(signature_name)
        arrays = sig.resolve_inputs(inputs)
        chosen = sig.resolve_outputs(output_filter)
        trace.batch_size = next((a.shape[0] for a in arrays.values() if a.ndim), 1)
        trace.model_version = self.version
        trace.delta_step = self.delta_step
        with trace.span("lookup"):
            if self.placed is not None:
                by_name = {sig.inputs[alias].name: arr for alias, arr in arrays.items()}
                feeds = self.placed.dense_feeds(by_name, self._lookup_rows)
            else:
                feeds = self._feeds(sig, arrays)
        with trace.span("run"):
            results = self.sessions.run(
                [sig.outputs[alias].name for _, alias in chosen], feeds, session=session, trace=trace
            )
        return {key: value for (key, _), value in zip(chosen, results)}

    def _feeds(self, sig: Signature, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        dense, bound, plan = self.plans[sig.name]
        feeds = {name: arrays[alias] for alias, name in dense}
        ids_list = [
            arrays[alias] if keys is None else keys.keys(arrays[alias]) for alias, _, keys in bound
        ]
        for (_, graph_input, _), out in zip(bound, plan.run(ids_list)):
            feeds[graph_input] = out
        return feeds

    def local_names(self, delta: Checkpoint) -> Checkpoint:
        """`delta` with its tables under this model's table names: a TensorFlow bundle names
        them after their Embedding Variables (model.json's checkpoint_names, DESIGN §4b)."""
        if delta.manifest.format != TF_BUNDLE_FORMAT:
            return delta
        names = self.model.spec.checkpoint_name
        tables = {t: delta.tables[names(t)] for t in self.tables if names(t) in delta.tables}
        mod = {b.table: b for b in self.model.spec.embeddings if b.mod_partitions}
        for b in mod.values():  # a 'mod'-partitioned variable's rows, by the ids they hold
            if b.table in tables:
                tables[b.table] = mod_partition_ids(tables[b.table], b.mod_partitions,
                                                    f"{delta.ref.path}: table {names(b.table)!r}")
        return dataclasses.replace(delta, tables=tables)

    @property
    def lost_beyond_repair(self) -> str | None:
        """Why this version can no longer be served, or None: Redis lost its rows and its
        files can no longer be read to import them again."""
        return self.redis.follower.unrecoverable if self.redis is not None else None

    def set_delta_step(self, delta_step: int) -> None:
        """The newest delta applied: answers name it from now on (the native route's too)."""
        self.delta_step = delta_step
        if self.native is not None:
            self.native.set_delta_step(delta_step)

    def apply_delta(self, delta: Checkpoint) -> int:
        """A delta's rows and deletions, in place (the updater checked it fits this version);
        returns the rows changed."""
        changed = self.redis.apply_delta(delta, apply_delta) if self.redis is not None else apply_delta(self.tables, delta)
        if self.on_delta is not None:
            self.on_delta(delta)
        return changed

    def _lookup_rows(self, table: str, ids: np.ndarray) -> np.ndarray:
        # A placed Gather's ids may have any rank: look them up flat, give ids.shape + [dim].
        t = self.tables[table]
        return t.lookup(ids.reshape(-1), "none").reshape(*ids.shape, t.dim)

    def close(self) -> None:
        """Free the version; the manager calls it once the last request's lease ends."""
        if self.native is not None:
            self.native.close()   # waits for the native leases: they read its tables and sessions
        self.sessions.close()
        if self.redis is not None:
            self.redis.close()
        elif self.owns_tables:
            for table in self.tables.values():
                table.close()  # a tiered table's files go with it
        if self.on_close is not None:
            self.on_close()


def binding_keys(binding: EmbeddingBinding) -> StringKeys | IntegerKeys | None:
    """How a binding's ids become keys (model.json's key_hash and its options): strings
    always; integers through an integer vocabulary; None: the ids are the keys."""
    if binding.key_dtype == "string":
        return StringKeys(binding.buckets, binding.vocabulary, binding.vocabulary_start,  # type: ignore[arg-type]
                          binding.default_id, binding.oov_buckets, binding.oov_start, binding.empty_is_padding)
    if binding.vocabulary:
        return IntegerKeys(binding.vocabulary, binding.vocabulary_start, binding.default_id,  # type: ignore[arg-type]
                           binding.empty_is_padding)
    return None
