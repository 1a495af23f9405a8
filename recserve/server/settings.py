"""Server-wide settings: request size limit and the admin token.

Read from the environment (``RECSERVE_MAX_REQUEST_BYTES``, ``RECSERVE_ADMIN_TOKEN``),
which wins over the config's ``max_request_bytes`` / ``admin_token`` fields when those
exist in the processor config (the largest limit and the first token among the models).
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


@dataclass(frozen=True, repr=False)
class ServerSettings:
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    admin_token: str | None = None   # None: admin routes are open

    def __repr__(self) -> str:
        token = "***" if self.admin_token else None
        return f"ServerSettings(max_request_bytes={self.max_request_bytes}, admin_token={token})"

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
        return cls(max_request_bytes=limit, admin_token=token)
