"""One Redis (or Redis Cluster) client and the health every caller of it shares.

redis-py's own retries are switched off (`Retry(NoBackoff(), 0)`) and every socket has a
timeout, so a call never hangs: it returns or raises within about `timeout` seconds. The
first failure opens a circuit: until `Backoff.compute(failures)` seconds have passed,
calls fail at once without touching the network; then the next call tries again (the
reconnect). Errors from redis-py become `StorageError` here and nowhere else; status 503,
as the service is unavailable, not broken. Messages name the server by its URL, never the
password.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from recserve.config.values import redact_url
from recserve.errors import StorageError
from recserve.model_store.backoff import Backoff

__all__ = ["RECONNECT_BACKOFF", "RedisConnection"]

RECONNECT_BACKOFF = Backoff(base=0.05, cap=2.0)

T = TypeVar("T")

# Failures that mean "the server is not reachable now"; anything else redis-py raises
# (a wrong type, a script error) is a reply from a live server.
_OUTAGES = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    OSError,
)


class RedisConnection:
    """A redis-py client (connection pool inside) with a shared circuit breaker.

    Thread-safe: `call` may run on any number of threads; redis-py's pool hands each
    concurrent call its own connection."""

    def __init__(
        self,
        url: str,
        *,
        password: str | None = None,
        cluster: bool = False,
        timeout: float = 1.0,
        backoff: Backoff = RECONNECT_BACKOFF,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = redact_url(url)
        self.cluster = cluster
        self.timeout = timeout
        self._backoff = backoff
        self._clock = clock
        self._options: dict[str, Any] = {
            "password": password or None,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        self._raw_url = url
        self.client = self._new_client(timeout)
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""

    def _new_client(self, socket_timeout: float) -> Any:
        options = dict(self._options, socket_timeout=socket_timeout)
        if self.cluster:
            return redis.RedisCluster.from_url(self._raw_url, **options)
        return redis.Redis.from_url(self._raw_url, **options)

    def blocking_client(self, block_seconds: float) -> Any:
        """A separate client whose reads may block `block_seconds` (XREAD BLOCK) on top of
        the usual timeout; the caller closes it."""
        return self._new_client(self.timeout + block_seconds)

    @property
    def healthy(self) -> bool:
        return self._failures == 0

    def call(self, what: str, action: Callable[[Any], T], client: Any = None) -> T:
        """`action(client)`, or StorageError(503) if Redis is unreachable or was recently.

        `what` completes "Redis ... while <what>" in messages; `client` defaults to
        `self.client` (pass one from `blocking_client` for blocking reads)."""
        now = self._clock()
        if self._failures and now < self._retry_at:
            raise StorageError(
                f"Redis at {self.url} is unreachable (last error: {self._last_error}); not "
                f"retrying for another {self._retry_at - now:.2f} s; needed while {what}",
                status=503,
            )
        try:
            result = action(self.client if client is None else client)
        except _OUTAGES as exc:
            with self._lock:
                self._failures += 1
                pause = self._backoff.compute(self._failures)
                self._retry_at = self._clock() + pause
                self._last_error = f"{type(exc).__name__}: {exc}"
            raise StorageError(
                f"Redis at {self.url} is unreachable ({self._last_error}) while {what}; "
                f"retrying after {pause:.2f} s",
                status=503,
            ) from exc
        except redis.exceptions.RedisError as exc:
            raise StorageError(f"Redis at {self.url} failed while {what}: {exc}") from exc
        if self._failures:
            with self._lock:
                self._failures = 0
        return result

    def close(self) -> None:
        self.client.close()
