"""Running warmup on a new version before it serves (DESIGN §7: ready = loaded and warmed up)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from recserve.errors import ModelLoadError, RequestError
from recserve.warmup.synthesize import synthesize_inputs
from recserve.warmup.warmup_file import read_warmup_file
from recserve.wire import codec

__all__ = ["Warmup", "WarmupResult"]

log = logging.getLogger("recserve.warmup")


class _Servable(Protocol):
    version: str
    tables: Mapping[str, Any]
    sessions: Any  # SessionGroup: `session_count`

    def signature(self, name: str | None) -> Any: ...

    def predict(self, inputs: Mapping[str, Any], output_filter: Sequence[str] | None = None, *,
                signature_name: str | None = None, session: int | None = None) -> dict[str, np.ndarray]: ...


@dataclass(frozen=True)
class WarmupResult:
    source: str        # "file" or "synthesized"
    requests: int      # distinct requests
    runs: int          # predict calls made (requests x sessions)
    rejected: int      # runs the model refused as bad requests (the file does not fit it)
    seconds: float


@dataclass(frozen=True)
class _Request:
    signature_name: str | None
    inputs: Mapping[str, Any]
    output_filter: tuple[str, ...]


class Warmup:
    """What every new version runs before it serves: the warmup file's requests, or, without
    one, `synthesized` requests of `batch` rows made from its default signature and keys that
    exist in its tables. Each request runs once on every session of the version's group.

    A request the model rejects (400) is counted and logged: the file does not fit this
    model. Any other failure raises ModelLoadError: the version must not serve.
    Immutable; thread-safe (a warmup runs on the updater thread only)."""

    def __init__(self, requests: Sequence[bytes] = (), *, synthesized: int = 4,
                 batch: int = 8, seed: int = 0) -> None:
        self._requests = [self._decode(i, r) for i, r in enumerate(requests)]
        self._synthesized = synthesized
        self._batch = batch
        self._seed = seed

    @staticmethod
    def _decode(index: int, payload: bytes) -> _Request:
        try:
            request = codec.decode_request(payload)
        except RequestError as exc:
            raise ModelLoadError(f"warmup request {index} is not a valid PredictRequest: {exc}") from exc
        return _Request(request.signature_name or None, request.inputs, tuple(request.output_filter))

    @classmethod
    def from_config(cls, config: Any) -> Warmup:
        """From `warmup_file_name` (if set) of a ProcessorConfig."""
        requests = read_warmup_file(config.warmup_file_name) if config.warmup_file_name else []
        return cls(requests)

    def _synthesize(self, servable: _Servable) -> list[_Request]:
        rng = np.random.default_rng(self._seed)
        signature = servable.signature(None)
        return [_Request(None, synthesize_inputs(signature, servable.tables, batch=self._batch, rng=rng), ())
                for _ in range(self._synthesized)]

    def run(self, servable: _Servable) -> WarmupResult:
        started = time.perf_counter()
        source = "file" if self._requests else "synthesized"
        requests = self._requests or self._synthesize(servable)
        runs = rejected = 0
        for index, request in enumerate(requests):
            # Every session of the group runs every request before the version serves.
            for session in range(servable.sessions.session_count):
                runs += 1
                try:
                    servable.predict(request.inputs, request.output_filter or None,
                                     signature_name=request.signature_name, session=session)
                except RequestError as exc:
                    rejected += 1
                    log.warning("version %s: warmup request %d rejected: %s", servable.version, index, exc)
                    break  # the same request fails the same way on every session
                except Exception as exc:  # onnxruntime and the engine may raise their own types
                    raise ModelLoadError(
                        f"warmup request {index} failed on version {servable.version}: {type(exc).__name__}: {exc}"
                    ) from exc
        return WarmupResult(source, len(requests), runs, rejected, time.perf_counter() - started)
