"""The processor config: DeepRec's processor JSON plus recserve's own fields (DESIGN §5).

`ProcessorConfig` *is* the table of fields: each field declares its type, default, how
its JSON value is read and checked (`recserve.config.values`), its status and a
one-line doc, so adding a field is one entry, and docs/config.md is rendered from it
(``python -m recserve.config --markdown``). Status says what recserve does with
a field: "honoured" (same meaning as DeepRec), "mapped" (translated to the ONNX Runtime
equivalent) or "advisory" (accepted for DeepRec configs, no effect; the doc says why).

`parse_config` reads one model's config; `parse_model_configs` reads configs that hold
several (EAS ``{"models": [...]}``). Both accept JSON text, bytes, a dict or a
`pathlib.Path`; a `str` is always JSON text, never a file name.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from recserve.config import values as kinds
from recserve.config.checks import check_consistency
from recserve.config.sources import EAS_SERVICE_KEYS, load_document, split_models
from recserve.config.values import Kind, Secret, close_match
from recserve.errors import ConfigError

__all__ = [
    "ConfigField",
    "ProcessorConfig",
    "Secret",
    "config_fields",
    "parse_config",
    "parse_model_configs",
]

Status = Literal["honoured", "mapped", "advisory"]
Origin = Literal["DeepRec", "recserve"]

VALID_FIELDS_HINT = (
    "Valid fields are listed in docs/config.md (or run: python -m recserve.config --markdown)."
)

_REQUIRED: Any = dataclasses.MISSING


@dataclass(frozen=True)
class ConfigField:
    """One row of the field table."""

    name: str
    kind: Kind
    default: Any
    status: Status
    doc: str
    origin: Origin
    secret: bool

    @property
    def required(self) -> bool:
        return self.default is dataclasses.MISSING


def _field(
    default: Any,
    kind: Kind,
    status: Status,
    doc: str,
    *,
    origin: Origin = "DeepRec",
    secret: bool = False,
) -> Any:
    meta = {"kind": kind, "status": status, "doc": doc, "origin": origin, "secret": secret}
    if default is _REQUIRED:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True, repr=False)
class ProcessorConfig:
    """One model's validated config. Immutable, so thread-safe to share.

    Build it with `parse_config`. Constructing it directly skips the per-field JSON
    checks (values must already have the declared types) but still runs the cross-field
    checks. Secret fields hold `Secret`; `repr`, `str` and `public_dict` show ``***``.
    """

    # -- session group ------------------------------------------------------------------
    session_num: int = _field(
        1, kinds.integer(1), "honoured",
        "ONNX Runtime sessions serving this model; all share one copy of the parameters.",
    )
    select_session_policy: str = _field(
        "MOD", kinds.choice("MOD", "RR", "LEAST_BUSY"), "honoured",
        "How a request picks its session: MOD = the calling thread's number modulo the "
        "session count (a thread keeps its session), RR = round robin, LEAST_BUSY "
        "(recserve) = the session with the fewest requests in flight.",
    )
    use_per_session_threads: bool = _field(
        False, kinds.boolean(), "mapped",
        "true: every session has its own intra/inter-op thread pools; false: the sessions "
        "share ONNX Runtime's process-wide pools (`set_global_thread_pool_sizes`) when "
        "ort_global_thread_pools is also true, else each keeps its own (see that field).",
    )
    cpusets: tuple[tuple[int, ...], ...] = _field(
        (), kinds.cpu_groups(), "mapped",
        "CPUs per session, ';' between sessions (\"0-3;4-7\"): session i's intra-op "
        "threads are pinned to group i. Needs use_per_session_threads and one group per session.",
    )
    gpu_ids_list: tuple[int, ...] = _field(
        (), kinds.gpu_ids(), "mapped",
        "GPUs (numbered as this process sees them, after CUDA_VISIBLE_DEVICES) to run on "
        "with the CUDA provider; session_num sessions per GPU. Empty: CPU only.",
    )
    use_multi_stream: bool = _field(
        False, kinds.boolean(), "mapped",
        "One CUDA stream per session, passed to the CUDA provider as `user_compute_stream` "
        "(untested here: no GPU).",
    )
    enable_device_placement_optimization: bool = _field(
        False, kinds.boolean(), "honoured",
        "Embedding lookups (Gathers on 2-D initializers) run in recserve's CPU embedding "
        "engine and the dense graph on the device (DESIGN §4).",
    )
    enable_inline_execute: bool = _field(
        False, kinds.boolean(), "mapped",
        "Run each request on the calling thread: ONNX Runtime intra/inter-op threads = 1, "
        "overriding intra_op_parallelism_threads and inter_op_parallelism_threads.",
    )
    omp_num_threads: int | None = _field(
        None, kinds.integer(1, numeric_string=True), "mapped",
        "Exported as OMP_NUM_THREADS when the processor starts (affects OpenMP libraries; "
        "the PyPI onnxruntime does not use OpenMP). Unset: environment left alone.",
    )
    kmp_blocktime: int | None = _field(
        None, kinds.integer(0, numeric_string=True), "mapped",
        "Exported as KMP_BLOCKTIME when the processor starts. Unset: environment left alone.",
    )
    inter_op_parallelism_threads: int = _field(
        0, kinds.integer(0), "honoured",
        "Inter-op threads per session pool; 0 = ONNX Runtime's default (DeepRec's default "
        "is SCHEDULABLE_CPUS/2).",
    )
    intra_op_parallelism_threads: int = _field(
        0, kinds.integer(0), "honoured",
        "Intra-op threads per session pool; 0 = ONNX Runtime's default, one per physical "
        "core (DeepRec's default is SCHEDULABLE_CPUS/2).",
    )
    model_update_inter_threads: int = _field(
        0, kinds.integer(0), "advisory",
        "No effect: versions load on the updater's own thread, never on the serving pools.",
    )
    model_update_intra_threads: int = _field(
        0, kinds.integer(0), "advisory",
        "No effect: versions load on the updater's own thread, never on the serving pools.",
    )
    signature_name: str = _field(
        "serving_default", kinds.text(), "honoured",
        "Signature served when a request names none.",
    )
    serialize_protocol: str = _field(
        "protobuf", kinds.choice("protobuf"), "honoured",
        "Request/response encoding of the C ABI: PredictRequest/PredictResponse protobuf.",
    )
    init_timeout_minutes: int = _field(
        -1, kinds.integer(1, also=(-1,)), "honoured",
        "initialize fails if no version is ready within this many minutes; -1 = wait "
        "without limit (DeepRec's default).",
    )
    warmup_file_name: str = _field(
        "", kinds.text(non_empty=False, values="local file path, or empty"), "honoured",
        "Warmup file (recorded PredictRequests) replayed on every new version before it "
        "serves; empty = no warmup file.",
    )
    # -- where the model lives ----------------------------------------------------------
    model_store_type: str = _field(
        "local", kinds.choice("local", "oss", "s3", "hdfs"), "honoured",
        "Storage of savedmodel_dir and checkpoint_dir: local files, OSS (oss://, or s3:// "
        "through OSS's S3 API), S3 (recserve) or HDFS (hdfs://).",
    )
    savedmodel_dir: str = _field(
        _REQUIRED, kinds.path(), "honoured",
        "The model dir, holding model.onnx and model.json (DESIGN §4).",
    )
    checkpoint_dir: str | None = _field(
        None, kinds.path(), "honoured",
        "Parent of the checkpoint versions, polled for new versions and deltas. Each version "
        "directory is recserve's format (MANIFEST.json) or a DeepRec / TensorFlow checkpoint "
        "(a `checkpoint` state file; local storage only so far), detected per directory. Unset: "
        "serve the graph's own parameters; nothing updates.",
    )
    oss_endpoint: str | None = _field(
        None, kinds.endpoint_url(), "honoured",
        "OSS/S3 endpoint: a host (\"oss-cn-beijing.aliyuncs.com\", https assumed) or an "
        "http(s):// URL. Required for model_store_type oss.",
    )
    oss_access_id: Secret | None = _field(  # noqa: RUF009 - _field returns a dataclasses.field
        None, kinds.secret(), "honoured",
        "OSS/S3 access key id. Required for oss; for s3, unset = boto3's default credentials.",
        secret=True,
    )
    oss_access_key: Secret | None = _field(  # noqa: RUF009 - _field returns a dataclasses.field
        None, kinds.secret(), "honoured",
        "OSS/S3 secret access key. Required for oss; for s3, set together with oss_access_id.",
        secret=True,
    )
    # -- embedding storage --------------------------------------------------------------
    feature_store_type: str = _field(
        "memory", kinds.choice("memory", "local", "redis"), "honoured",
        "Where embedding rows live: memory or local (the same: recserve's in-process "
        "engine) or redis (a Redis server shared by instances).",
    )
    redis_url: str | None = _field(
        None, kinds.redis_url(), "honoured",
        "Redis server for feature_store_type redis: \"host:port\" (DeepRec's form, "
        "normalized to redis://host:port), redis://… or rediss://… (TLS); with redis_cluster, "
        "several seed nodes, comma-separated (any one that answers gives the cluster's node map).",
    )
    redis_password: Secret | None = _field(  # noqa: RUF009 - _field returns a dataclasses.field
        None, kinds.secret(), "honoured",
        "Redis password (AUTH). Unset or empty: no AUTH.",
        secret=True,
    )
    read_thread_num: int = _field(
        4, kinds.integer(1, 96), "honoured",
        "Threads (each with its own connection) fetching embedding rows from Redis.",
    )
    update_thread_num: int = _field(
        2, kinds.integer(1, 16), "honoured",
        "Threads writing a new version's rows to Redis.",
    )
    lock_timeout: int = _field(
        900, kinds.integer(1), "honoured",
        "Redis store: the longest a replica waits for another replica's import of a new "
        "version, or its write of a delta (the lock itself expires after 30 s without renewal).",
    )
    ev_storage_type: int = _field(
        0, kinds.choice(0, 1, 12), "mapped",
        "Embedding tiers: 0 = default (DRAM), 1 = DRAM, 12 = DRAM + SSD (rows beyond the "
        "DRAM tier spill to ev_storage_path).",
    )
    ev_storage_path: str | None = _field(
        None, kinds.text(), "mapped",
        "Directory of the SSD tier; required for ev_storage_type 12.",
    )
    ev_storage_size: tuple[int, ...] = _field(
        (), kinds.tier_sizes(), "mapped",
        "Bytes per tier [DRAM, SSD] for ev_storage_type 12; a missing tier gets 1 GiB, as "
        "in DeepRec.",
    )
    shard_embedding: bool = _field(
        False, kinds.only_false("recserve does not shard embedding tables across instances"),
        "advisory",
        "Only false is accepted: recserve does not shard embedding tables across instances.",
    )
    # -- timeline -----------------------------------------------------------------------
    timeline_start_step: int | None = _field(
        None, kinds.integer(0), "mapped",
        "First request to trace. The timeline_* fields go together; traces are ONNX "
        "Runtime profiles (Chrome trace JSON).",
    )
    timeline_interval_step: int | None = _field(
        None, kinds.integer(1), "mapped", "Requests between two traces."
    )
    timeline_trace_count: int | None = _field(
        None, kinds.integer(1), "mapped", "Number of traces to write."
    )
    timeline_path: str | None = _field(
        None, kinds.text(values="absolute local dir or oss:// URL"), "mapped",
        "Where traces go: an absolute local directory, or oss:// (needs the oss_* fields).",
    )
    # -- recserve -----------------------------------------------------------------------
    model_update_interval_seconds: float = _field(
        5.0, kinds.number(above=0), "honoured",
        "Seconds between two polls of checkpoint_dir for new versions and deltas.",
        origin="recserve",
    )
    full_update_mode: str = _field(
        "swap", kinds.choice("swap", "in_place"), "honoured",
        "How a new full version replaces the serving one. swap: built beside it, then swapped "
        "in at once (peak memory ~2x the tables). in_place: its rows are written into the "
        "serving tables table by table (keys absent from it deleted), then the sessions are "
        "swapped; requests meanwhile may see old and new rows, as during a delta. Falls back to "
        "swap, with a log line, when table names or dims changed, for placed plain ONNX models "
        "and for tables in Redis.",
        origin="recserve",
    )
    pinned_version: str | None = _field(
        None, kinds.text(), "honoured",
        "Serve this version (a directory name under checkpoint_dir) and its deltas, never "
        "a newer full version: rollback. Unset: the newest complete version.",
        origin="recserve",
    )
    max_batch_size: int = _field(
        0, kinds.integer(0), "honoured",
        "Request merging (dynamic batching): predictions of this model waiting at the same moment "
        "(arrived in one pass of the HTTP event loop, or queued behind a running batch) run as "
        "one ONNX Runtime run of up to this many rows; each caller gets exactly its own rows. "
        "0 = off (docs/sessions.md, \"Request merging\", says why off is the default).",
        origin="recserve",
    )
    batch_timeout_micros: int = _field(
        0, kinds.integer(0), "honoured",
        "With request merging, the longest a request waits for others to merge with; 0 = no "
        "wait: only requests already waiting are merged, and an idle server runs a request at once. "
        "The server waits at most half of max_queue_ms.",
        origin="recserve",
    )
    execution_provider: str = _field(
        "auto", kinds.choice("auto", "cpu", "cuda", "tensorrt"), "honoured",
        "Where the dense graph runs: auto = cuda when gpu_ids_list is set, else cpu; "
        "tensorrt needs max_batch_size (its engine's largest batch).",
        origin="recserve",
    )
    allow_cpu_fallback: bool = _field(
        False, kinds.boolean(), "honoured",
        "If the CUDA or TensorRT provider does not start, serve on the CPU with a warning "
        "instead of failing the load.",
        origin="recserve",
    )
    trt_fp16_enable: bool = _field(
        False, kinds.boolean(), "honoured", "TensorRT provider: build fp16 engines.", origin="recserve",
    )
    trt_engine_cache_path: str = _field(
        "", kinds.text(non_empty=False, values="directory, or empty"), "honoured",
        "TensorRT provider: directory caching built engines across restarts; empty = no cache.",
        origin="recserve",
    )
    allow_spinning: bool = _field(
        False, kinds.boolean(), "honoured",
        "Let idle ONNX Runtime pool threads busy-wait for work (ONNX Runtime's default); off "
        "by default, as spinning burns the cores other sessions need.",
        origin="recserve",
    )
    ort_global_thread_pools: bool = _field(
        False, kinds.boolean(), "honoured",
        "With use_per_session_threads false, share ONNX Runtime's process-wide pools; once "
        "they exist ONNX Runtime refuses any session with its own pools in the process, so "
        "without this every session keeps its own pools.",
        origin="recserve",
    )
    prepack_weights: bool | str = _field(
        "auto", kinds.boolean_or_auto(), "honoured",
        "Prepack MatMul/Gemm weights (faster: the DLRM MLP at batch 1 runs ~35% quicker) at the "
        "cost of a packed copy: one for all sessions on the native ONNX Runtime runner (they share "
        "it), one per session on the Python binding's sessions (string inputs, "
        "RECSERVE_NATIVE_DENSE=0). auto: prepack when that costs one extra copy of at most 256 MiB "
        "of shared dense weights, else share the unpacked weights.",
        origin="recserve",
    )
    redis_cluster: bool = _field(False, kinds.boolean(), "honoured", "feature_store_type redis: redis_url is a node of a Redis Cluster (redis-py's cluster client).", origin="recserve")
    redis_cache_rows: int = _field(1_000_000, kinds.integer(1), "honoured", "feature_store_type redis: rows of each table cached locally (hot rows; beyond it random rows are evicted).", origin="recserve")
    redis_serve_defaults_when_down: bool = _field(False, kinds.boolean(), "honoured", "feature_store_type redis: while Redis is unreachable, uncached keys get the table default instead of failing the request (503).", origin="recserve")
    redis_timeout_seconds: float = _field(1.0, kinds.number(above=0), "honoured", "feature_store_type redis: socket timeout of every Redis connect and round trip.", origin="recserve")
    redis_version_grace_seconds: float = _field(600.0, kinds.number(above=0), "honoured", "feature_store_type redis: a version older than the newest two expires from Redis this long after a newer one is imported.", origin="recserve")
    redis_stream_updates: bool = _field(True, kinds.boolean(), "honoured", "feature_store_type redis: apply real-time row updates from the model's Redis stream (recserve.export.RowUpdateWriter).", origin="recserve")

    max_request_bytes: int = _field(
        64 * 1024 * 1024, kinds.integer(1), "honoured",
        "Server: the largest HTTP body or gRPC message accepted (413 / RESOURCE_EXHAUSTED "
        "beyond); with several models the largest value applies; env RECSERVE_MAX_REQUEST_BYTES wins.",
        origin="recserve",
    )
    max_queued_requests: int = _field(
        128, kinds.integer(1), "honoured",
        "Server: requests for this model that may wait for their turn; one more is answered at once, "
        "undecoded: HTTP 503 with Retry-After, gRPC RESOURCE_EXHAUSTED (admission control).",
        origin="recserve",
    )
    max_queue_ms: float = _field(
        100.0, kinds.number(above=0), "honoured",
        "Server: a request that waited longer than this for its turn is answered 503 / "
        "RESOURCE_EXHAUSTED instead of being run (so a client can try another replica while its "
        "own timeout still allows).",
        origin="recserve",
    )
    admin_token: Secret | None = _field(  # noqa: RUF009 - _field returns a dataclasses.field
        None, kinds.secret(), "honoured",
        "Server: bearer token the admin routes (load/pin a version) require; unset = admin "
        "routes open; env RECSERVE_ADMIN_TOKEN wins.",
        origin="recserve", secret=True,
    )

    def __post_init__(self) -> None:
        check_consistency(self)

    def __repr__(self) -> str:
        items = ", ".join(f"{name}={value!r}" for name, value in self.public_dict().items())
        return f"ProcessorConfig({items})"

    def public_dict(self) -> dict[str, Any]:
        """Every field as JSON-ready values, secrets replaced by ``"***"``: for model info and logs."""
        return {f.name: _public(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def env_overrides(self) -> dict[str, str]:
        """Environment variables to set before ONNX Runtime starts (omp_num_threads, kmp_blocktime)."""
        env = {}
        if self.omp_num_threads is not None:
            env["OMP_NUM_THREADS"] = str(self.omp_num_threads)
        if self.kmp_blocktime is not None:
            env["KMP_BLOCKTIME"] = str(self.kmp_blocktime)
        return env

    @property
    def uses_redis(self) -> bool:
        return self.feature_store_type == "redis"

    @property
    def session_count(self) -> int:
        """Sessions in the group: session_num, times the number of GPUs when there are any."""
        return self.session_num * max(1, len(self.gpu_ids_list))

    @property
    def ev_tier_sizes(self) -> tuple[int, int]:
        """(DRAM bytes, SSD bytes) for ev_storage_type 12, a missing tier defaulting to 1 GiB."""
        sizes = self.ev_storage_size + (_GIB, _GIB)
        return sizes[0], sizes[1]


_GIB = 1 << 30


def _public(value: Any) -> Any:
    if isinstance(value, Secret):
        return "***"
    if isinstance(value, tuple):
        return [_public(v) for v in value]
    return value


def config_fields() -> list[ConfigField]:
    """The field table, in declaration order."""
    return [
        ConfigField(
            name=f.name,
            kind=f.metadata["kind"],
            default=f.default,
            status=f.metadata["status"],
            doc=f.metadata["doc"],
            origin=f.metadata["origin"],
            secret=f.metadata["secret"],
        )
        for f in dataclasses.fields(ProcessorConfig)
    ]


_FIELDS = {f.name: f for f in config_fields()}

# -- parsing -----------------------------------------------------------------------------

# DeepRec's sharded-embedding fields; recserve refuses them rather than ignoring them.
_SHARDING_FIELDS = ("embedding_names", "shard_instance_count", "id_type")


def _unknown_field(name: str) -> ConfigError:
    if name in _SHARDING_FIELDS:
        return ConfigError(
            f"field {name!r} configures DeepRec's sharded embedding, which recserve does not "
            "support; remove it",
            field=name,
        )
    if name in EAS_SERVICE_KEYS:
        return ConfigError(
            f"field {name!r} is an EAS service key, not a model field; put the model fields "
            'under "model_config" next to it',
            field=name,
        )
    hint = close_match(name, list(_FIELDS))
    head = f"unknown field {name!r}" + (f"; did you mean {hint!r}?" if hint else ".")
    return ConfigError(f"{head} {VALID_FIELDS_HINT}", field=name)


def _from_fields(fields: Mapping[str, Any]) -> ProcessorConfig:
    values: dict[str, Any] = {}
    for name, raw in fields.items():
        spec = _FIELDS.get(name)
        if spec is None:
            raise _unknown_field(name)
        if raw is None:  # DeepRec treats null as absent (jsoncpp isNull)
            continue
        values[name] = spec.kind.read(name, raw)
    for spec in _FIELDS.values():
        if spec.required and spec.name not in values:
            raise ConfigError(f"{spec.name} is required: {spec.doc[0].lower()}{spec.doc[1:]}", field=spec.name)
    return ProcessorConfig(**values)


def _in_model(name: str, exc: ConfigError) -> ConfigError:
    return ConfigError(f"model {name!r}: {exc.message}", field=exc.field)


def parse_model_configs(
    raw: str | bytes | Mapping[str, Any] | os.PathLike[str],
) -> list[tuple[str, ProcessorConfig]]:
    """[(model name, config)] for every model the config describes, in its order.

    A flat DeepRec config or an EAS ``{"model_config": ...}`` gives one model (named by
    the EAS ``name`` or ``metadata.name``, else "default"); ``{"models": [...]}`` gives
    one per entry, each an EAS service object with a ``name``."""
    models = split_models(load_document(raw))
    out = []
    for name, fields in models:
        try:
            out.append((name, _from_fields(fields)))
        except ConfigError as exc:
            if len(models) == 1:
                raise
            raise _in_model(name, exc) from None
    return out


def parse_config(raw: str | bytes | Mapping[str, Any] | os.PathLike[str]) -> ProcessorConfig:
    """The config of the one model `raw` describes; see `parse_model_configs` for the forms."""
    models = parse_model_configs(raw)
    if len(models) != 1:
        names = ", ".join(name for name, _ in models)
        raise ConfigError(
            f"the config describes {len(models)} models ({names}); load it with "
            "parse_model_configs or `recserve serve --config`"
        )
    return models[0][1]

