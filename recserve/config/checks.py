"""Checks across processor-config fields (DESIGN §5): a setting that needs another one, or
a path that does not match its store. Each error names the field to fix and how. Pure
functions, thread-safe.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from recserve.errors import ConfigError

if TYPE_CHECKING:
    from recserve.config.schema import ProcessorConfig

__all__ = ["check_consistency"]

_SCHEMES_FOR_STORE = {"local": (None,), "oss": ("oss", "s3"), "s3": ("s3",), "hdfs": ("hdfs",)}
_STORE_FOR_SCHEME = {"oss": "oss", "s3": "s3", "hdfs": "hdfs"}
_TIMELINE = ("timeline_start_step", "timeline_interval_step", "timeline_trace_count", "timeline_path")
_OSS_CREDENTIALS = ("oss_endpoint", "oss_access_id", "oss_access_key")


def _scheme(path: str) -> str | None:
    head, sep, _ = path.partition("://")
    return head.lower() if sep else None


def _check_store_path(config: ProcessorConfig, name: str) -> None:
    path: str | None = getattr(config, name)
    if path is None:
        return
    scheme = _scheme(path)
    store = config.model_store_type
    if scheme is not None and scheme not in _STORE_FOR_SCHEME:
        raise ConfigError(
            f"{name} {path!r} has unsupported scheme {scheme}://; use a local path or an "
            "oss://, s3:// or hdfs:// URL",
            field=name,
        )
    allowed = _SCHEMES_FOR_STORE[store]
    if scheme in allowed:
        return
    what = "a local path" if scheme is None else f"an {scheme}:// path"
    wanted = "a local path" if allowed == (None,) else " or ".join(f"{s}://" for s in allowed) + " paths"
    other = "local" if scheme is None else _STORE_FOR_SCHEME[scheme]
    raise ConfigError(
        f"{name} {path!r} is {what} but model_store_type is {store!r}, which reads {wanted}; "
        f"set model_store_type to {other!r} or change {name}",
        field=name,
    )


def _missing(config: ProcessorConfig, names: tuple[str, ...]) -> list[str]:
    return [n for n in names if getattr(config, n) is None]


def check_consistency(config: ProcessorConfig) -> None:
    """Raise ConfigError naming the first pair of fields that contradict each other."""
    for name in ("savedmodel_dir", "checkpoint_dir"):
        _check_store_path(config, name)
    if config.model_store_type == "oss" and (missing := _missing(config, _OSS_CREDENTIALS)):
        raise ConfigError(
            "model_store_type 'oss' needs oss_endpoint, oss_access_id and oss_access_key; "
            f"missing: {', '.join(missing)}",
            field=missing[0],
        )
    if (config.oss_access_id is None) != (config.oss_access_key is None):
        given, absent = (
            ("oss_access_id", "oss_access_key") if config.oss_access_key is None else ("oss_access_key", "oss_access_id")
        )
        raise ConfigError(f"{given} is set but {absent} is not; set both or neither", field=absent)
    if config.uses_redis and config.redis_url is None:
        raise ConfigError(
            "feature_store_type 'redis' needs redis_url (\"host:port\" or \"redis://host:port\")",
            field="redis_url",
        )
    if config.redis_url is not None and "," in config.redis_url and not config.redis_cluster:
        raise ConfigError(
            "redis_url names several nodes, which only a Redis Cluster has; set redis_cluster true, "
            "or give one node",
            field="redis_url",
        )
    if config.ev_storage_type == 12 and config.ev_storage_path is None:
        raise ConfigError(
            "ev_storage_type 12 (DRAM + SSD) needs ev_storage_path, the SSD tier's directory",
            field="ev_storage_path",
        )
    _check_timeline(config)
    if config.cpusets:
        if not config.use_per_session_threads:
            raise ConfigError(
                "cpusets pins each session's own thread pools; set use_per_session_threads to true",
                field="cpusets",
            )
        if len(config.cpusets) != config.session_count:
            why = f"session_num {config.session_num}"
            if config.gpu_ids_list:
                why += f" x {len(config.gpu_ids_list)} GPUs"
            groups, sessions = len(config.cpusets), config.session_count
            raise ConfigError(
                f"cpusets has {groups} group{'s' * (groups != 1)} but the model has {sessions} "
                f"session{'s' * (sessions != 1)} ({why}); give one group per session",
                field="cpusets",
            )
    if config.pinned_version is not None and config.checkpoint_dir is None:
        raise ConfigError("pinned_version needs checkpoint_dir, the parent of the versions", field="pinned_version")


def _check_timeline(config: ProcessorConfig) -> None:
    missing = _missing(config, _TIMELINE)
    if len(missing) == len(_TIMELINE):
        return
    if missing:
        raise ConfigError(
            f"the timeline needs all of {', '.join(_TIMELINE)}; missing: {', '.join(missing)}",
            field=missing[0],
        )
    path = config.timeline_path or ""
    if _scheme(path) == "oss":
        if missing := _missing(config, _OSS_CREDENTIALS):
            raise ConfigError(
                f"timeline_path {path!r} needs oss_endpoint, oss_access_id and oss_access_key; "
                f"missing: {', '.join(missing)}",
                field=missing[0],
            )
    elif not path.startswith("/"):
        raise ConfigError(
            f"timeline_path must be an absolute local directory or an oss:// URL, got {path!r}",
            field="timeline_path",
        )
