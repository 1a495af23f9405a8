"""`Processor`: one served model behind DeepRec's processor semantics (DESIGN §2, §3, §6).

`process(bytes) -> (status, bytes)` is the C ABI's path and never raises; `predict` is the
Python path and raises `recserve.errors.*`. Thread-safe: any number of threads may call
`process`/`predict` while versions are swapped underneath (each request leases one).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from recserve.errors import InternalError, RecserveError
from recserve.model_store.checkpoint import Checkpoint, load_checkpoint
from recserve.model_store.manifest import Manifest
from recserve.model_store.model_dir import load_model_dir
from recserve.model_store.storage import LocalStorage
from recserve.model_store.versions import VersionRef, newest_complete_version
from recserve.processor import codec
from recserve.processor.config import ProcessorConfig, parse_config
from recserve.processor.manager import ServableManager
from recserve.processor.servable import Servable
from recserve.processor.trace import RequestTrace

__all__ = ["Processor"]

log = logging.getLogger("recserve.processor")


class Processor:
    def __init__(
        self, config: str | bytes | Mapping[str, Any] | ProcessorConfig, *, model_name: str = "default"
    ) -> None:
        self.config = config if isinstance(config, ProcessorConfig) else parse_config(config)
        self.model_name = model_name
        self._manager: ServableManager[Servable] = ServableManager(model_name)
        self._storage = LocalStorage()
        self._last_error: str | None = None
        self._state_lock = threading.Lock()
        self._closed = False
        self._model = load_model_dir(self._storage, self.config.savedmodel_dir)
        self._manager.swap(self._load_newest())

    # -- loading -------------------------------------------------------------------------

    def _load_newest(self) -> Servable:
        if self.config.checkpoint_dir is None:
            # DESIGN §4: without checkpoint_dir the graph's own values serve; nothing updates.
            checkpoint = Checkpoint(
                VersionRef("graph", self.config.savedmodel_dir, 0), Manifest("full", 0, {}), {}, {}
            )
        else:
            ref, manifest = newest_complete_version(self._storage, self.config.checkpoint_dir, log=log)
            checkpoint = load_checkpoint(self._storage, ref, manifest)
        servable = Servable.load(self._model, checkpoint, self.config)
        log.info("model %r: serving version %s (global_step %d)", self.model_name, servable.version, servable.global_step)
        return servable

    # -- serving -------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._manager.current is not None

    def predict(
        self,
        inputs: Mapping[str, Any],
        outputs: Sequence[str] | None = None,
        *,
        signature_name: str | None = None,
        trace: RequestTrace | None = None,
    ) -> dict[str, np.ndarray]:
        """Outputs keyed by alias (or by the name used in `outputs`); raises RecserveError."""
        with self._manager.acquire() as servable:
            try:
                return servable.predict(inputs, outputs, signature_name=signature_name, trace=trace)
            except RecserveError:
                raise
            except Exception as exc:
                log.exception("model %r: predict failed", self.model_name)
                raise InternalError(f"internal error: {type(exc).__name__}: {exc}") from exc

    def process(self, data: bytes, *, trace: RequestTrace | None = None) -> tuple[int, bytes]:
        """(200, PredictResponse bytes) or (status, UTF-8 message). Never raises."""
        trace = trace or RequestTrace()
        try:
            if not data:
                return 200, json.dumps(self.signature_info()).encode()
            with trace.span("decode"):
                request = codec.decode_request(data)
            outputs = self.predict(
                request.inputs,
                request.output_filter,
                signature_name=request.signature_name or None,
                trace=trace,
            )
            with trace.span("encode"):
                return 200, codec.encode_response(outputs)
        except RecserveError as exc:
            return exc.status, exc.message.encode()
        except Exception as exc:  # the C ABI's callers must never see an exception
            log.exception("model %r: process failed", self.model_name)
            return 500, f"internal error: {type(exc).__name__}: {exc}".encode()

    # -- introspection -------------------------------------------------------------------

    def signature_info(self, signature_name: str | None = None) -> dict[str, Any]:
        with self._manager.acquire() as servable:
            return servable.signature(signature_name).describe()

    def model_info(self) -> dict[str, Any]:
        servable = self._manager.current
        return {
            "model_name": self.model_name,
            "model_path": self.config.checkpoint_dir,
            "savedmodel_dir": self.config.savedmodel_dir,
            "ready": servable is not None,
            "version": servable.version if servable else None,
            "global_step": servable.global_step if servable else None,
            "update_time": (
                time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(servable.loaded_at)) if servable else None
            ),
            "signature_name": servable.default_signature if servable else None,
            "last_error": self._last_error,
        }

    def model_info_bytes(self) -> bytes:
        return codec.encode_model_info(self.model_info())

    def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
        self._manager.swap(None)
