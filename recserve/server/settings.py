"""Server-wide settings: request size limit, the admin token, and which HTTP predictions
run on the event loop (`recserve.server.inline_policy`).

Read from the environment (``RECSERVE_MAX_REQUEST_BYTES``, ``RECSERVE_ADMIN_TOKEN``),
which wins over the config's ``max_request_bytes`` / ``admin_token`` fields when those
exist in the processor config (the largest limit and the first token among the models);
``RECSERVE_INLINE_MAX_BYTES`` and ``RECSERVE_INLINE_MAX_MS`` (0 turns inline runs off).
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


@dataclass(frozen=True, repr=False)
class ServerSettings:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    admin_token: str | None = None   # None: admin routes are open
    inline_max_bytes: int = DEFAULT_INLINE_MAX_BYTES
    inline_max_ms: float = DEFAULT_INLINE_MAX_MS

    def __repr__(self) -> str:
        token = "***" if self.admin_token else None
        return (f"ServerSettings(max_request_bytes={self.max_request_bytes}, admin_token={token}, "
                f"inline_max_bytes={self.inline_max_bytes}, inline_max_ms={self.inline_max_ms})")

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
        )


def _env_number(env: Mapping[str, str], name: str, default: float, unit: str) -> float:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"{name} must be a number >= 0 ({unit}; 0 turns inline runs off), got {raw!r}")
    return value
