"""Which session of a group serves a request (`select_session_policy`).

- MOD: each calling OS thread gets a number the first time it calls (0, 1, 2, ... in
  order of arrival) and always uses session `number % N`, as DeepRec does: an RPC thread
  keeps its session, its CPU group and its warm caches. The thread's OS id is the key, so
  it holds for host threads that enter Python afresh on every C ABI call.
- RR: round robin over calls.
- LEAST_BUSY: the session with the fewest runs in flight; ties go round robin.
Thread-safe: `acquire`/`release` may be called from any thread.
"""

from __future__ import annotations

import itertools
import threading

from recserve.errors import ConfigError

__all__ = ["POLICIES", "SessionPolicy"]

POLICIES = ("MOD", "RR", "LEAST_BUSY")

# Thread numbers are remembered per OS thread id; a server that keeps creating threads
# would grow the map without bound, so it is reset past this size (threads renumber).
_MAX_REMEMBERED_THREADS = 4096


class SessionPolicy:
    def __init__(self, policy: str, sessions: int) -> None:
        if policy not in POLICIES:
            raise ConfigError(
                f"select_session_policy must be one of {', '.join(POLICIES)}, got {policy!r}",
                field="select_session_policy",
            )
        self.policy = policy
        self.sessions = sessions
        self._lock = threading.Lock()
        self._counter = itertools.count()
        self._thread_numbers: dict[int, int] = {}
        self._in_flight = [0] * sessions

    def thread_number(self) -> int:
        """The calling thread's stable number (MOD's key)."""
        ident = threading.get_ident()
        number = self._thread_numbers.get(ident)
        if number is None:
            with self._lock:
                if len(self._thread_numbers) >= _MAX_REMEMBERED_THREADS:
                    self._thread_numbers.clear()
                number = self._thread_numbers.setdefault(ident, len(self._thread_numbers))
        return number

    def acquire(self) -> int:
        """The session index for this call; pair with `release(index)` when the run ends."""
        if self.policy == "MOD":
            index = self.thread_number() % self.sessions
        elif self.policy == "RR":
            index = next(self._counter) % self.sessions
        else:
            with self._lock:
                start = next(self._counter) % self.sessions
                order = self._in_flight[start:] + self._in_flight[:start]
                index = (start + order.index(min(order))) % self.sessions
                self._in_flight[index] += 1
            return index
        with self._lock:
            self._in_flight[index] += 1
        return index

    def release(self, index: int) -> None:
        with self._lock:
            self._in_flight[index] -= 1

    def in_flight(self) -> list[int]:
        with self._lock:
            return list(self._in_flight)
