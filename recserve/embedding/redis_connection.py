"""One Redis (or Redis Cluster) client and the health every caller of it shares.

redis-py's own retries are switched off (`Retry(NoBackoff(), 0)`) and every socket has a
timeout, so a call never hangs: it returns or raises within about `timeout` seconds. The
first failure opens a circuit: until `Backoff.compute(failures)` seconds have passed,
calls fail at once without touching the network; then the next call tries again (the
reconnect). Errors from redis-py become `StorageError` here and nowhere else; status 503,
as the service is unavailable, not broken. A refused password is a `ConfigError` naming
redis_password instead: no retry can fix it. Messages name the server by its URL, never the
password.

A Redis Cluster is reached through its node map, not through the node `redis_url` names:
that node may be the master that died. redis-py's cluster client refreshes its map after a
failure; every client made later (the stream follower's blocking one, one per version)
starts from the nodes the map holds now, then the configured seeds (`redis_url` may list
several, comma-separated).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import redis
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode
from redis.retry import Retry

from recserve.config.values import redact_url, redis_urls
from recserve.errors import ConfigError, StorageError
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


# Replies of a live server to a missing or wrong password (ConnectionError subclasses in
# redis-py, so they are caught before _OUTAGES).
_REFUSED_CREDENTIALS = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)


# redis-py's cluster client can fail with AttributeError ("'NoneType' object has no attribute
# 'redis_connection'") while another thread rebuilds its node map after a node died: for a
# cluster that too means "not reachable now".
_CLUSTER_OUTAGES = (*_OUTAGES, AttributeError)


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
        self._seeds = redis_urls(url)
        self.url = ",".join(redact_url(seed) for seed in self._seeds)
        self.cluster = cluster
        self._outages = _CLUSTER_OUTAGES if cluster else _OUTAGES
        self.timeout = timeout
        self._backoff = backoff
        self._clock = clock
        self._options: dict[str, Any] = {
            "password": password or None,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
            "retry": Retry(NoBackoff(), 0),
        }
        self.client: Any = None
        self.client = self._new_client(timeout)
        self._lock = threading.Lock()
        self._failures = 0
        self._retry_at = 0.0
        self._last_error = ""

    def _new_client(self, socket_timeout: float) -> Any:
        options = dict(self._options, socket_timeout=socket_timeout)
        if not self.cluster:
            return redis.Redis.from_url(self._seeds[0], **options)
        seed = urlsplit(self._seeds[0])
        try:
            return redis.RedisCluster(startup_nodes=self._startup_nodes(), ssl=seed.scheme == "rediss",
                                      username=seed.username, **options)
        except (*_OUTAGES, redis.exceptions.RedisClusterException) as exc:
            raise StorageError(f"no node of the Redis Cluster at {self.url} answers: {exc}", status=503) from exc
        except redis.exceptions.RedisError as exc:
            raise StorageError(f"Redis Cluster at {self.url}: {exc}") from exc

    def _startup_nodes(self) -> list[ClusterNode]:
        """The cluster's nodes as the current client knows them, then the configured seeds."""
        known = [(n.host, int(n.port)) for n in self.client.get_nodes()] if self.client is not None else []
        seeds = [(urlsplit(u).hostname or "localhost", urlsplit(u).port or 6379) for u in self._seeds]
        return [ClusterNode(host, port) for host, port in dict.fromkeys(known + seeds)]

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
        target = self.client if client is None else client
        try:
            try:
                result = action(target)
            except self._outages:
                if not self.cluster:
                    raise
                # redis-py refreshed its node map on that failure (a master died and its
                # replica took over): the same call may now reach the new owner of the slot.
                result = action(target)
        except _REFUSED_CREDENTIALS as exc:
            # A live server refusing redis_password: waiting or reconnecting cannot fix it.
            raise ConfigError(
                f"Redis at {self.url} refused the credentials ({type(exc).__name__}: {exc}) while {what}; "
                "check redis_password", field="redis_password",
            ) from exc
        except self._outages as exc:
            if client is not None:
                # A caller's own client (a blocking stream read) fails alone: the circuit is
                # the lookups', and a stale blocking connection says nothing about them.
                raise StorageError(f"Redis at {self.url} is unreachable ({type(exc).__name__}: {exc}) while {what}",
                                   status=503) from exc
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
