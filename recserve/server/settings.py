"""Server-wide settings: request size limit, the admin token, and which HTTP predictions
run on the event loop (`recserve.server.inline_policy`).

Read from the environment (``RECSERVE_MAX_REQUEST_BYTES``, ``RECSERVE_ADMIN_TOKEN``),
which wins over the config's ``max_request_bytes`` / ``admin_token`` fields when those
exist in the processor config (the largest limit and the first token among the models);
``RECSERVE_INLINE_MAX_BYTES``, ``RECSERVE_INLINE_MAX_MS`` (0 turns inline runs off) and
``RECSERVE_INLINE_MAX_RELEASED_MS`` (the GIL-free part; unlimited by default);
the HTTP connection limits (`recserve.server.http_protocol`): ``RECSERVE_HTTP_HEADER_TIMEOUT_S``,
``RECSERVE_HTTP_BODY_TIMEOUT_S``, ``RECSERVE_HTTP_KEEPALIVE_S``, ``RECSERVE_HTTP_MAX_CONNECTIONS``.
Immutable, thread-safe.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from recserve.config import ProcessorConfig, Secret
from recserve.errors import ConfigError

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "ServerSettings"]

DEFAULT_MAX_REQUEST_BYTES = 64 << 20
# Measured on the demo and the DLRM-like model (README, "Server"): a batch-64 demo request is
# ~19 KB and runs ~0.3 ms; predictions up to ~1 ms cost the loop less than the hop.
DEFAULT_INLINE_MAX_BYTES = 64 << 10
DEFAULT_INLINE_MAX_MS = 1.0
# The GIL-free part of a prediction (the native route's C call) above which it runs on a
# worker, overlapping the loop's work on another core. Unlimited by default: the hop costs
# CPU (KServe v2 JSON batch 64 of the DLRM-like model, 2 cores: ~1,100 against ~850 us per
# request) and pays only while a core is spare (idle, all on workers: +25% requests/s; with
# other work on the machine: -10 to -30%). A single process on a machine with cores to spare may set 0.1.
DEFAULT_INLINE_MAX_RELEASED_MS = float("inf")
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_KEEPALIVE_S = 15.0
DEFAULT_MAX_CONNECTIONS = 4096
# How long SIGTERM's drain lets requests in flight finish, in one process or across workers
# (the image's stop timeout and the manifests' grace period are chosen above it).
GRACE_SECONDS = 30.0


@dataclass(frozen=True, repr=False)
class ServerSettings:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    admin_token: str | None = None   # None: admin routes are open
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES
    inline_max_ms: float = DEFAULT_INLINE_MAX_MS
    inline_max_released_ms: float = DEFAULT_INLINE_MAX_RELEASED_MS
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S
    keepalive_s: float = DEFAULT_KEEPALIVE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS

    def __repr__(self) -> str:
        token = "***" if self.admin_token else None
        return (f"ServerSettings(max_request_bytes={self.max_request_bytes}, admin_token={token}, "
                f"inline_max_bytes={self.inline_max_bytes}, inline_max_ms={self.inline_max_ms}, "
                f"inline_max_released_ms={self.inline_max_released_ms}, "
                f"header_timeout_s={self.header_timeout_s}, body_timeout_s={self.body_timeout_s}, "
                f"keepalive_s={self.keepalive_s}, max_connections={self.max_connections})")

    def admin_allowed(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value carries the admin bearer token."""
        if self.admin_token is None:
            return True
        scheme, _, token = (authorization or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), self.admin_token)

    @classmethod
    def resolve(
        cls, configs: Sequence[ProcessorConfig], env: Mapping[str, str] | None = None
    ) -> ServerSettings:
        env = os.environ if env is None else env
        limit = max(
            (int(v) for c in configs if (v := getattr(c, "max_request_bytes", None)) is not None),
            default=DEFAULT_MAX_REQUEST_BYTES,
        )
        raw_limit = env.get("RECSERVE_MAX_REQUEST_BYTES")
        if raw_limit is not None:
            if not raw_limit.isdigit() or int(raw_limit) < 1:
                raise ConfigError(
                    f"RECSERVE_MAX_REQUEST_BYTES must be a positive integer (bytes), got {raw_limit!r}"
                )
            limit = int(raw_limit)
        token = env.get("RECSERVE_ADMIN_TOKEN") or None
        if token is None:
            for c in configs:
                value = getattr(c, "admin_token", None)
                if value:
                    token = value.reveal() if isinstance(value, Secret) else str(value)
                    break
        return cls(
            max_request_bytes=limit, admin_token=token,
            inline_max_bytes=int(_env_number(env, "RECSERVE_INLINE_MAX_BYTES", DEFAULT_INLINE_MAX_BYTES, "bytes")),
            inline_max_ms=_env_number(env, "RECSERVE_INLINE_MAX_MS", DEFAULT_INLINE_MAX_MS, "milliseconds"),
            inline_max_released_ms=_env_number(env, "RECSERVE_INLINE_MAX_RELEASED_MS", DEFAULT_INLINE_MAX_RELEASED_MS,
                                               "milliseconds", infinite=True),
            header_timeout_s=_env_number(env, "RECSERVE_HTTP_HEADER_TIMEOUT_S", DEFAULT_HEADER_TIMEOUT_S, "seconds",
                                         positive=True),
            body_timeout_s=_env_number(env, "RECSERVE_HTTP_BODY_TIMEOUT_S", DEFAULT_BODY_TIMEOUT_S, "seconds",
                                       positive=True),
            keepalive_s=_env_number(env, "RECSERVE_HTTP_KEEPALIVE_S", DEFAULT_KEEPALIVE_S, "seconds", positive=True),
            max_connections=int(_env_number(env, "RECSERVE_HTTP_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS,
                                            "open connections", positive=True)),
        )


def _env_number(env: Mapping[str, str], name: str, default: float, unit: str, *, positive: bool = False,
                infinite: bool = False) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not (value > 0 if positive else value >= 0) or (value == float("inf") and not infinite):
        bound = "> 0" if positive else ">= 0"
        raise ConfigError(f"{name} must be a number {bound} ({unit}), got {raw!r}")
    return value
