"""Which HTTP predictions run on the event loop's own thread, and which hop to a worker.

The hop to a worker thread (`run_in_executor`) costs more CPU than a small prediction
itself: two thread wake-ups, a future, and the GIL handed back and forth while the loop and
the worker both want it (measured here: a bare uvicorn app 46 us of CPU per request, 86 us
with one hop). A prediction that is short runs inline: the loop is busy for that long and
serves nothing else meanwhile, which costs the other connections less than the hop would.
"Short" is known only after the fact, so each model keeps an exponentially weighted mean of
its predictions' wall time; a request runs inline while that mean is at most
`max_seconds` and its body at most `max_bytes` (a large body predicts a long run before
the mean has seen one).

A prediction the native route serves runs most of its time with the GIL released. On a
worker thread that part can overlap the loop's own work (reading, parsing and answering the
other connections) on a spare core, which a run on the loop forbids: so a model may also be
kept inline only while the mean of that GIL-free part stays at most `max_released_seconds`
(unlimited by default: the hop costs CPU, and pays only while a core is spare; README,
"Server", has the measurements). The limits come from the environment.

Thread-safety: called from the event loop only; a lost update of the mean is harmless.
"""

from __future__ import annotations

__all__ = ["InlinePolicy"]

# Weight of the newest run in the mean: ~20 requests of memory.
_WEIGHT = 0.05


class InlinePolicy:
    def __init__(self, max_bytes: int, max_seconds: float, max_released_seconds: float = float("inf")) -> None:
        self.max_bytes = max_bytes
        self.max_seconds = max_seconds
        self.max_released_seconds = max_released_seconds
        self._mean: dict[str, float] = {}
        self._released: dict[str, float] = {}

    def inline(self, model: str, body_bytes: int) -> bool:
        """Whether a request for `model` with a body of `body_bytes` runs on the loop. A model
        not seen yet runs on a worker first, so a slow one never stalls the loop unmeasured."""
        mean = self._mean.get(model)
        return (mean is not None and 0 < self.max_seconds and mean <= self.max_seconds
                and body_bytes <= self.max_bytes and self._released[model] <= self.max_released_seconds)

    def record(self, model: str, seconds: float, released: float = 0.0) -> None:
        """One prediction of `model` took `seconds`, `released` of them with the GIL released."""
        # One slow run (a GC pass, the GIL held by a worker thread) must not move a short model
        # off the loop, where requests sent to workers starve behind the loop's inline runs: a
        # run counts for at most twice the limit, so only a sustained change moves the mean
        # across it.
        seconds = min(seconds, 2 * self.max_seconds)
        released = min(released, 2 * self.max_released_seconds)
        mean = self._mean.get(model)
        if mean is None:
            self._mean[model] = seconds
            self._released[model] = released
        else:
            self._mean[model] = mean + _WEIGHT * (seconds - mean)
            self._released[model] += _WEIGHT * (released - self._released[model])
